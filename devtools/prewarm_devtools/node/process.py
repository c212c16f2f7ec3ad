"""A daemon run as a child process: own process group, log collected to a file, stopped by PID.

Every daemon dies with the thread that started it (``PR_SET_PDEATHSIG``): a local stack killed with
SIGKILL leaves no containerd, registry or agent running. Start daemons from a thread that lives as
long as they should (the main thread, or a long-lived worker), never from a short-lived one.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import os
import shutil
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path


class DaemonStartError(RuntimeError):
    """A daemon exited or never became ready; the message ends with the tail of its log."""


@dataclass(frozen=True)
class ProcessExit:
    """How a daemon's last run ended: its return code as `Popen` gives it (negative: the signal that
    killed it), and `requested`, what ended it on the operator's or a test's request (`stop`: SIGTERM,
    `kill`: SIGKILL), empty when nobody here asked (it crashed, exited, or someone else killed it)."""

    returncode: int
    requested: str = ""

    @classmethod
    def of_wait_status(cls, status: int, requested: str = "") -> ProcessExit:
        """From a shell-style exit status (a container's: 128 + N for signal N)."""
        return cls(-(status - 128) if 128 < status < 160 else status, requested)

    @property
    def signal_name(self) -> str | None:
        if self.returncode >= 0:
            return None
        try:
            return signal.Signals(-self.returncode).name
        except ValueError:
            return f"signal {-self.returncode}"

    @property
    def cause(self) -> str:
        """`killed by SIGKILL` or `exit code 1`."""
        name = self.signal_name
        return f"killed by {name}" if name else f"exit code {self.returncode}"


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago (the daemon binds it next)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def _libc() -> ctypes.CDLL | None:
    try:
        return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
    except OSError:
        return None


# glibc's mallopt parameter for the number of malloc arenas.
M_ARENA_MAX = -8
LOCAL_MALLOC_ARENAS = 2


def limit_malloc_arenas(arenas: int = LOCAL_MALLOC_ARENAS) -> bool:
    """Caps glibc's malloc arenas for the threads started from now on; False where libc has no mallopt.

    glibc gives threads arenas of their own, up to 8 per core, and memory freed in one is rarely handed
    back: a local stack's dozens of threads (servers, pumps, agents, invocations) grew its RSS by about
    2.4 MB a job where two arenas held it to about 1 MB (benchmarks/local_memory.py, 12 jobs). What
    MALLOC_ARENA_MAX=2 does, set from inside: `prewarm local up` is one long-lived process.
    """
    libc = _libc()
    try:
        return libc is not None and bool(libc.mallopt(M_ARENA_MAX, arenas))
    except AttributeError:
        return False


def die_with_parent(argv: Sequence[str]) -> list[str]:
    """`argv` under util-linux's ``setpriv --pdeathsig KILL``, which sets ``PR_SET_PDEATHSIG`` and execs
    it: the kernel SIGKILLs the daemon when the thread that started it exits.

    Not a ``preexec_fn``: one makes Popen fork() instead of vfork(), and grpcio's fork handlers (1.81
    and later) then start a poller in the child that aborts on the descriptors Popen closes before
    exec: about one containerd start in a hundred "exited with code -6" beside running agents.
    """
    setpriv = shutil.which("setpriv")
    if setpriv is None:
        raise DaemonStartError("setpriv is needed to tie daemons to local mode's life (apt-get install -y util-linux)")
    return [setpriv, "--pdeathsig", "KILL", "--", *argv]


def process_start_time(pid: int) -> int | None:
    """When the process started (clock ticks since boot, /proc/PID/stat field 22), None if it is gone.

    A pid with its start time names one process for good: a pid reused later has another start time.
    """
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as stat:
            fields = stat.read().rpartition(")")[2].split()
    except (FileNotFoundError, ProcessLookupError):
        return None
    # fields[0] is the state (field 3); the start time is field 22.
    return None if fields[0] in ("Z", "X") else int(fields[19])


def process_running(pid: int, start_time: int | None = None) -> bool:
    """Whether that process is alive (a zombie counts as exited), and is the one that started at ``start_time``."""
    started = process_start_time(pid)
    return started is not None and (start_time is None or started == start_time)


class LoopbackEndpoint:
    """A server on 127.0.0.1:``port`` speaking plain HTTP (a registry, or a proxy in front of one)."""

    port: int = 0

    @property
    def host(self) -> str:
        """``127.0.0.1:<port>``: the host part of image references served here."""
        return f"127.0.0.1:{self.port}"

    @property
    def url(self) -> str:
        """``http://127.0.0.1:<port>``: the endpoint for ``PrivateContainerd.add_registry_mirror``."""
        return f"http://{self.host}"


class DaemonProcess:
    """One daemon process. ``start`` then ``wait_ready``; ``stop`` sends SIGTERM, then SIGKILL."""

    def __init__(self, name: str, argv: Sequence[str], log_path: Path, env: dict[str, str] | None = None) -> None:
        self.name = name
        self.argv = list(argv)
        self.log_path = log_path
        self.env = env
        self._process: subprocess.Popen[bytes] | None = None
        self._last_exit: ProcessExit | None = None

    @property
    def pid(self) -> int | None:
        """PID of the running process, None when stopped."""
        return self._process.pid if self.running and self._process is not None else None

    @property
    def start_time(self) -> int | None:
        """The running process's start time (see ``process_start_time``), None when stopped."""
        pid = self.pid
        return process_start_time(pid) if pid is not None else None

    @property
    def running(self) -> bool:
        """True while the process has not exited."""
        return self._process is not None and self._process.poll() is None

    @property
    def last_exit(self) -> ProcessExit | None:
        """How the last run ended; None while it runs or before it started."""
        process = self._process
        if process is not None:
            code = process.poll()
            return None if code is None else ProcessExit(code)  # ended without `stop` or `kill`
        return self._last_exit

    def start(self) -> None:
        """Start the process, appending its stdout and stderr to the log file."""
        if self.running:
            raise DaemonStartError(f"{self.name} is already running as PID {self.pid}")
        self._last_exit = None
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with self.log_path.open("ab") as log:
            log.write(f"--- starting {' '.join(self.argv)}\n".encode())
            log.flush()
            # Own session and process group, so a Ctrl-C aimed at pytest does not reach it first.
            self._process = subprocess.Popen(
                die_with_parent(self.argv),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=self.env,
                start_new_session=True,
            )

    def wait_ready(self, ready: Callable[[], bool], timeout: float, interval: float = 0.05) -> None:
        """Poll ``ready()`` until it is true; raise DaemonStartError with the log if it never is."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not self.running:
                code = self._process.returncode if self._process is not None else None
                raise DaemonStartError(f"{self.name} exited with code {code}\n{self.log_tail()}")
            if ready():
                return
            time.sleep(interval)
        self.stop()
        raise DaemonStartError(f"{self.name} did not become ready within {timeout:g}s\n{self.log_tail()}")

    def stop(self, grace: float = 5.0) -> None:
        """SIGTERM the process, SIGKILL it if still alive after ``grace`` seconds, and reap it."""
        process = self._process
        if process is None:
            return
        requested = ""  # one that had ended before is reported as it ended
        if process.poll() is None:
            requested = "stop"
            os.kill(process.pid, signal.SIGTERM)
            try:
                process.wait(timeout=grace)
            except subprocess.TimeoutExpired:
                os.kill(process.pid, signal.SIGKILL)
                process.wait()
        self._ended(process, requested)

    def kill(self) -> None:
        """SIGKILL the process at once (a crash, for fault tests) and reap it."""
        process = self._process
        if process is None:
            return
        requested = ""
        if process.poll() is None:
            requested = "kill"
            os.kill(process.pid, signal.SIGKILL)
            process.wait()
        self._ended(process, requested)

    def _ended(self, process: subprocess.Popen[bytes], requested: str) -> None:
        self._last_exit = ProcessExit(process.returncode, requested)
        self._process = None

    def log_tail(self, lines: int = 40) -> str:
        """The last ``lines`` lines of the log, labelled with the daemon's name."""
        try:
            text = self.log_path.read_text(encoding="utf-8", errors="replace")
        except FileNotFoundError:
            return f"(no {self.name} log at {self.log_path})"
        tail = "\n".join(text.splitlines()[-lines:])
        return f"--- last {lines} lines of {self.log_path}\n{tail}"


class DaemonBacked:
    """A server run as one ``DaemonProcess`` (``self._daemon``): its pid, start time and liveness."""

    _daemon: DaemonProcess

    @property
    def pid(self) -> int | None:
        """PID of the running process, None when stopped."""
        return self._daemon.pid

    @property
    def start_time(self) -> int | None:
        """The running process's start time (see ``process_start_time``), None when stopped."""
        return self._daemon.start_time

    @property
    def running(self) -> bool:
        """True while the process is alive."""
        return self._daemon.running

    @property
    def last_exit(self) -> ProcessExit | None:
        """How its last run ended (None while it runs)."""
        return self._daemon.last_exit


class Ticker:
    """Calls `tick()` every `interval` seconds on a daemon thread of its own until `stop`; a tick that raises is
    logged and the next one comes (a controller or kubelet local mode plays keeps playing)."""

    def __init__(self, name: str, tick: Callable[[], None], interval: float) -> None:
        self.name, self._tick, self._interval = name, tick, interval
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> Ticker:
        self._stop.clear()

        def loop() -> None:
            while not self._stop.wait(self._interval):
                try:
                    self._tick()
                except Exception:  # the next tick tries again
                    logging.getLogger(__name__).exception("%s", self.name)

        self._thread = threading.Thread(target=loop, name=self.name, daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
            self._thread = None
