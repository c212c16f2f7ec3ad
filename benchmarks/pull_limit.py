"""How close a CRI pull comes to what the machine could do, on each containerd version and setting.

One image (`--image-mb`, 2 GiB by default, in `--layers` gzip layers of compressible bytes: random
symbols from 16, about half their size gzipped) is pushed to a local registry (docker-registry on
127.0.0.1). Then, on this machine:

- the registry's read rate: every layer blob read over HTTP at once, as a pull does (the better of two
  reads: the blobs are then in the page cache, as they are for the pulls);
- the disk's write rate: the image's unpacked bytes written in 1 MiB blocks next to containerd's root,
  then fsync'ed (containerd fsyncs every blob it commits);
- the floor: the image's compressed bytes divided by the slower of the two rates, as if a pull were
  nothing but one stream from the registry to the disk. A real pull also writes each layer unpacked,
  so the floor is a bound no pull reaches, and `x floor` says how far each one is from it.

Each pull is CRI `PullImage` on a fresh containerd (its own root: nothing is reused) of each version
(`--versions`: 2.1, 1.7, 1.6, as `make node-deps PREWARM_CONTAINERD=...` installed them) with each
setting (`--settings`) that changes how containerd pulls: `max_concurrent_downloads`, `unpigz` on its
PATH (`make node-deps` unpacks Debian's pigz under build/pigz), the snapshotter, and on 2.x the
transfer service's own: pulling without it (`use_local_image_pull`), its `max_concurrent_downloads`,
and `concurrent_layer_fetch_buffer` (several ranged requests per layer). After each pull the daemon
is stopped, its data removed and the disk synced.

Needs root. Only this benchmark uses a 2 GiB image: run it once, on a quiet machine.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

if __name__ == "__main__" and not __package__:  # run as a file: make `benchmarks` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.agent_overhead import require_node_tools
from benchmarks.measure import ROOT, BenchmarkError, emit, load_average, print_machine

MIB = 1024 * 1024
VERSIONS = ("1.6", "1.7", "2.1")
UNPIGZ_DIR = ROOT / "build" / "pigz" / "usr" / "bin"
# 16 symbols: 4 bits of entropy a byte, so gzip halves the data, about what it does to real images.
_SYMBOLS = bytes(b"abcdefghijklmnop"[i % 16] for i in range(256))
PULL_TIMEOUT = 1800.0


@dataclass(frozen=True)
class Setting:
    """One way of running containerd for a pull; `versions` it applies to."""

    name: str
    versions: tuple[str, ...] = VERSIONS
    pull: dict[str, Any] = field(default_factory=dict)
    snapshotter: str | None = None
    needs: Callable[[], str | None] = lambda: None


def _unpigz_missing() -> str | None:
    return None if (UNPIGZ_DIR / "unpigz").is_file() else f"no unpigz under {UNPIGZ_DIR} (make node-deps)"


SETTINGS = (
    Setting("default"),
    Setting("max_concurrent_downloads=1", pull={"max_concurrent_downloads": 1}),
    Setting("max_concurrent_downloads=8", pull={"max_concurrent_downloads": 8}),
    Setting("unpigz", pull={"unpigz_dir": UNPIGZ_DIR}, needs=_unpigz_missing),
    Setting("snapshotter=native", snapshotter="native"),
    Setting("local pull (no transfer service)", versions=("2.1",), pull={"local_pull": True}),
    Setting("concurrent_layer_fetch_buffer=16MiB", versions=("2.1",),
            pull={"layer_fetch_buffer": 16 * MIB, "max_concurrent_downloads": 8}),
)


def build_pushed_image(registry: Any, total_mb: int, layers: int) -> tuple[Any, int]:
    """Build and push the image; returns it and its unpacked bytes (the layers' tars)."""
    from prewarm_devtools.node.images import RegistryPusher, build_image, build_layer

    each = total_mb * MIB // layers
    built = []
    for number in range(layers):
        data = os.urandom(each).translate(_SYMBOLS)
        # gzip level 1 keeps the build to about a minute; a pull's cost is in gunzip, the same at any level.
        built.append(build_layer({f"data/layer-{number}.bin": data}, compresslevel=1))
        del data
    image = build_image(layers=built)
    pushed = RegistryPusher(registry.url).push_image("bench/pull-limit", "v1", image)
    return pushed, each * layers


def registry_read_rate(registry: Any, pushed: Any) -> float:
    """Bytes a second the registry serves the image's layers at, all at once; the better of two reads."""

    def read(digest: str) -> int:
        url = f"{registry.url}/v2/bench/pull-limit/blobs/{digest}"
        count = 0
        with urllib.request.urlopen(url, timeout=600) as response:
            while chunk := response.read(MIB):
                count += len(chunk)
        return count

    best = 0.0
    for _ in range(2):
        started = time.monotonic()
        with ThreadPoolExecutor(max_workers=len(pushed.layer_digests)) as pool:
            total = sum(pool.map(read, pushed.layer_digests))
        best = max(best, total / (time.monotonic() - started))
    return best


def disk_write_rate(directory: Path, size: int) -> float:
    """Bytes a second written to the disk holding `directory`, fsync included."""
    block = os.urandom(MIB)
    path = directory / "write-probe"
    started = time.monotonic()
    with path.open("wb") as out:
        for _ in range(size // MIB):
            out.write(block)
        out.flush()
        os.fsync(out.fileno())
    elapsed = time.monotonic() - started
    path.unlink()
    return size // MIB * MIB / elapsed


def pull_once(base: Path, version: str, setting: Setting, registry: Any, reference: str) -> float:
    """Seconds of one CRI pull on a fresh containerd run as `setting` says."""
    from prewarm_devtools.node.containerd import PrivateContainerd, PullSettings

    containerd = PrivateContainerd(base / f"c{version}", version=version, snapshotter=setting.snapshotter,
                                   pull=PullSettings(**setting.pull), start_timeout=60)
    containerd.add_registry_mirror(registry.host, registry.url)
    containerd.start()
    try:
        with containerd.cri_client(timeout=60) as cri:
            started = time.monotonic()
            cri.pull_image(reference, timeout=PULL_TIMEOUT).result(timeout=PULL_TIMEOUT)
            return time.monotonic() - started
    finally:
        containerd.stop()
        containerd.remove_data()
        subprocess.run(["sync"], check=False)


def plan(versions: Sequence[str], names: Sequence[str] | None) -> tuple[list[tuple[str, Setting]], list[str]]:
    """The (version, setting) pulls to run, and why others are left out."""
    from prewarm_devtools.node.containerd import containerd_bin_dir

    runs, skipped = [], []
    chosen = [s for s in SETTINGS if names is None or s.name in names]
    if names is not None and len(chosen) != len(set(names)):
        unknown = sorted(set(names) - {s.name for s in SETTINGS})
        raise BenchmarkError(f"--settings: unknown {', '.join(unknown)}; one of: {', '.join(s.name for s in SETTINGS)}")
    for version in versions:
        if containerd_bin_dir(version) is None:
            skipped.append(f"containerd {version}: not installed (make node-deps PREWARM_CONTAINERD={version})")
            continue
        for setting in chosen:
            why = setting.needs()
            if why is not None:
                skipped.append(f"{version} {setting.name}: {why}")
            elif version in setting.versions:
                runs.append((version, setting))
    return runs, skipped


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--image-mb", type=int, default=2048, help="the image's unpacked size (MiB)")
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--versions", default=",".join(VERSIONS[::-1]), help="comma-separated: 2.1,1.7,1.6")
    parser.add_argument("--settings", default=None, help="comma-separated setting names (default: all)")
    args = parser.parse_args(argv)
    require_node_tools("pull_limit.py")
    from prewarm_devtools.node.registry import LocalRegistry

    versions = [v for v in args.versions.split(",") if v]
    runs, skipped = plan(versions, args.settings.split(",") if args.settings else None)
    print_machine()
    for why in skipped:
        print(f"skipped: {why}")
    base = Path(tempfile.mkdtemp(prefix="pl-", dir="/tmp"))
    registry = LocalRegistry(base / "registry")
    registry.start()
    try:
        started = time.monotonic()
        pushed, unpacked = build_pushed_image(registry, args.image_mb, args.layers)
        compressed = pushed.total_size
        print(f"image: {args.layers} layers, {unpacked / MIB:,.0f} MiB unpacked, {compressed / MIB:,.0f} MiB "
              f"gzipped (built and pushed in {time.monotonic() - started:.0f} s)")
        read_rate = registry_read_rate(registry, pushed)
        write_rate = disk_write_rate(base, unpacked)
        floor = compressed / min(read_rate, write_rate)
        print(f"registry read {read_rate / MIB:,.0f} MiB/s, disk write {write_rate / MIB:,.0f} MiB/s: "
              f"floor {floor:.2f} s")
        print(f"{'containerd':<11}{'setting':<38}{'seconds':>9}{'MiB/s':>9}{'x floor':>9}")
        pulls = []
        for version, setting in runs:
            seconds = pull_once(base, version, setting, registry, pushed.reference)
            pulls.append({"version": version, "setting": setting.name, "seconds": round(seconds, 2),
                          "vs_floor": round(seconds / floor, 2)})
            print(f"{version:<11}{setting.name:<38}{seconds:>9.2f}{compressed / MIB / seconds:>9.0f}"
                  f"{seconds / floor:>9.2f}", flush=True)
    finally:
        registry.stop()
        registry.remove_data()
        subprocess.run(["rm", "-rf", str(base)], check=False)
    emit({"image_bytes": compressed, "unpacked_bytes": unpacked, "layers": args.layers,
          "registry_read_mib_s": round(read_rate / MIB, 1), "disk_write_mib_s": round(write_rate / MIB, 1),
          "floor_s": round(floor, 4), "pulls": pulls, "skipped": skipped, "load_average": load_average()})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
