"""Local mode caps glibc's malloc arenas: its many threads otherwise each grow an arena of their own."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

# Eight threads allocate at once, then glibc's malloc_info says how many heaps (arenas) exist.
PROBE = textwrap.dedent("""
    import ctypes, ctypes.util, os, sys, tempfile, threading
    from prewarm_devtools.node.process import limit_malloc_arenas
    if sys.argv[1] == "capped":
        assert limit_malloc_arenas(2)
    libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
    libc.malloc.restype = ctypes.c_void_p
    libc.free.argtypes = [ctypes.c_void_p]
    libc.fopen.restype = ctypes.c_void_p
    libc.malloc_info.argtypes = [ctypes.c_int, ctypes.c_void_p]
    libc.fclose.argtypes = [ctypes.c_void_p]
    barrier = threading.Barrier(8)
    def work():
        barrier.wait()
        blocks = [libc.malloc(4096) for _ in range(2000)]
        barrier.wait()
        for b in blocks:
            libc.free(b)
    threads = [threading.Thread(target=work) for _ in range(8)]
    for t in threads: t.start()
    for t in threads: t.join()
    path = tempfile.mktemp()
    fp = libc.fopen(path.encode(), b"w")
    libc.malloc_info(0, fp)
    libc.fclose(fp)
    print(open(path).read().count("<heap nr="))
    os.unlink(path)
""")


def heaps(mode: str) -> int:
    done = subprocess.run([sys.executable, "-c", PROBE, mode], capture_output=True, text=True, timeout=60,
                          check=False)
    assert done.returncode == 0, done.stderr
    return int(done.stdout.strip())


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt")
def test_limit_malloc_arenas_keeps_threads_in_two_arenas() -> None:
    # Given eight threads allocating at the same time, with and without the cap
    # Then capped, glibc keeps two heaps; uncapped it made more (one per contending thread, up to 8 per core)
    assert heaps("capped") <= 2
    assert heaps("free") > 2
