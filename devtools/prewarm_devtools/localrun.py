"""What a local stack leaves on this machine, recorded so `prewarm local down` can clean up after a crash.

A local stack writes its *run record* before it starts anything, next to the state file
(`~/.prewarm/local.run.json` beside `~/.prewarm/local.json`), and rewrites it as each child process
starts: the stack's own pid, its run directory (containerd roots, registry data, logs) and every child
(name, pid and start time, so a reused pid is never taken for it). Children also die with the stack
(`PR_SET_PDEATHSIG`, see `node.process`); the record is for what outlives it anyway: containerd's
overlay mounts and the gigabytes of its run directory, or a child whose death signal was lost.

`clean_up(record)` stops what is still running (SIGTERM to its process group, SIGKILL after a grace),
unmounts every mount under the run directory, removes the directory, and says what it did.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from prewarm_devtools.node.containerd import unmount_all_under
from prewarm_devtools.node.process import process_running, process_start_time


class RunRecordError(RuntimeError):
    """The run record cannot be read; the message names the file."""


@dataclass
class RecordedProcess:
    name: str
    pid: int
    start_time: int | None = None

    @property
    def running(self) -> bool:
        return process_running(self.pid, self.start_time)


@dataclass
class RunRecord:
    """A local stack's process, run directory and children (see the module's docstring)."""

    pid: int
    run_dir: str
    start_time: int | None = None
    own_dir: bool = True
    children: list[RecordedProcess] = field(default_factory=list)

    @classmethod
    def of_this_process(cls, run_dir: Path, *, own_dir: bool) -> RunRecord:
        return cls(pid=os.getpid(), start_time=process_start_time(os.getpid()), run_dir=str(run_dir), own_dir=own_dir)

    @property
    def running(self) -> bool:
        """Whether the stack's own process is still alive."""
        return process_running(self.pid, self.start_time)

    @property
    def logs_dir(self) -> Path:
        return Path(self.run_dir) / "logs"

    def add_child(self, name: str, pid: int | None, start_time: int | None) -> None:
        if pid is not None:
            self.children = [c for c in self.children if c.name != name] + [RecordedProcess(name, pid, start_time)]

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, doc: dict[str, Any]) -> RunRecord:
        children = [RecordedProcess(**c) for c in doc.get("children", [])]
        return cls(pid=int(doc["pid"]), run_dir=str(doc["run_dir"]), start_time=doc.get("start_time"),
                   own_dir=bool(doc.get("own_dir", True)), children=children)


def run_record_path(state_path: Path) -> Path:
    """The run record beside the state file: `local.json` has `local.run.json`."""
    return state_path.with_name(f"{state_path.stem}.run.json")


def kubeconfig_path(state_path: Path) -> Path:
    """The cluster admin's kubeconfig beside the state file: `local.json` has `local.kubeconfig`."""
    return state_path.with_name(f"{state_path.stem}.kubeconfig")


def write_run_record(record: RunRecord, path: Path) -> None:
    """Writes the record atomically, readable by its owner only."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".run-", suffix=".json", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(record.to_json(), f, indent=2)
            f.write("\n")
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def read_run_record(path: Path) -> RunRecord | None:
    """The record at `path`, None when there is none."""
    try:
        return RunRecord.from_json(json.loads(path.read_text(encoding="utf-8")))
    except FileNotFoundError:
        return None
    except (ValueError, KeyError, TypeError) as e:
        raise RunRecordError(f"{path}: not a local stack's run record ({e}); remove it by hand") from e


@dataclass
class Cleanup:
    """What `clean_up` found left behind and removed."""

    stopped: list[str] = field(default_factory=list)
    unmounted: int = 0
    removed: list[str] = field(default_factory=list)

    def lines(self) -> list[str]:
        out = [f"stopped {name}" for name in self.stopped]
        if self.unmounted:
            out.append(f"unmounted {self.unmounted} mount{'s' if self.unmounted != 1 else ''}")
        out += [f"removed {what}" for what in self.removed]
        return out


def wait_exited(processes: list[RecordedProcess], timeout: float) -> list[RecordedProcess]:
    """Waits until none of `processes` runs, or `timeout` passes; returns those still running."""
    deadline = time.monotonic() + timeout
    while (alive := [p for p in processes if p.running]) and time.monotonic() < deadline:
        time.sleep(0.05)
    return alive


def _signal_group(process: RecordedProcess, signum: int) -> None:
    # Children run in their own session: their process group id is their pid.
    try:
        os.killpg(process.pid, signum)
    except (ProcessLookupError, PermissionError):
        with contextlib.suppress(ProcessLookupError):
            os.kill(process.pid, signum)


def stop_processes(processes: list[RecordedProcess], grace: float) -> list[RecordedProcess]:
    """SIGTERM to each running process's group, SIGKILL to what is left after `grace`; returns those
    that were running. Returns once every one has exited."""
    running = [p for p in processes if p.running]
    for process in running:
        _signal_group(process, signal.SIGTERM)
    for process in wait_exited(running, grace):
        _signal_group(process, signal.SIGKILL)
    if left := wait_exited(running, 10.0):
        raise RuntimeError("still running after SIGKILL: " + ", ".join(f"{p.name} (pid {p.pid})" for p in left))
    return running


def processes_under(run_dir: Path) -> list[RecordedProcess]:
    """Processes whose command line names a path in `run_dir` (containerd, the registry): a safety net
    for a child the record missed."""
    needle = str(run_dir.resolve()) + "/"
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if any(arg.decode(errors="replace").startswith(needle) for arg in argv):
            pid = int(entry.name)
            name = Path(argv[0].decode(errors="replace")).name or "process"
            found.append(RecordedProcess(name, pid, process_start_time(pid)))
    return found


def _size(path: Path) -> int:
    total = 0
    for root, _dirs, files in os.walk(path):
        for name in files:
            try:
                total += os.lstat(os.path.join(root, name)).st_size
            except OSError:
                continue
    return total


def human_bytes(count: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if count < 1024 or unit == "GiB":
            return f"{count:.0f} {unit}" if unit == "B" else f"{count:.1f} {unit}"
        count /= 1024
    return f"{count:.1f} GiB"


def clean_up(record: RunRecord, *, grace: float = 5.0) -> Cleanup:
    """Stops the record's children (and any process running from its run directory), unmounts and
    removes the run directory. The stack's own process must have exited."""
    done = Cleanup()
    run_dir = Path(record.run_dir)
    children = list(record.children)
    if run_dir.exists():
        known = {(c.pid, c.start_time) for c in children}
        children += [p for p in processes_under(run_dir) if (p.pid, p.start_time) not in known]
    done.stopped = [f"{p.name} (pid {p.pid})" for p in stop_processes(children, grace)]
    if run_dir.exists():
        done.unmounted = unmount_all_under(run_dir)
        if record.own_dir:
            size = _size(run_dir)
            shutil.rmtree(run_dir, ignore_errors=True)
            done.removed.append(f"{run_dir} ({human_bytes(size)})")
    return done
