"""`prewarm local logs`: the local stack's log files, read (and followed) from its run directory.

The functions all write JSON lines to `logs/functions.log` (Powertools, each under its own `service`);
each agent process writes JSON lines to `logs/agent-NODE.log`. The run directory is found through the
run record, so the logs of a stack that crashed can still be read until `prewarm local down`.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import click

from prewarm_cli.errors import CommandError

FUNCTIONS_LOG = "functions.log"
_AGENT_PREFIX = "agent-"
_CHUNK = 1 << 20


def stack_logs() -> tuple[Path, Callable[[], bool]]:
    """The running (or crashed) local stack's logs directory, and whether its process still runs."""
    from prewarm_cli.targets import local_state_path, read_local_state
    from prewarm_devtools.localrun import read_run_record, run_record_path

    path = local_state_path()
    record = read_run_record(run_record_path(path))
    if record is not None:
        return record.logs_dir, lambda: record.running
    if path.exists():
        state = read_local_state(path)
        if run_dir := state.env.get("LOCAL_RUN_DIR"):
            return Path(run_dir) / "logs", lambda: state.running
    raise CommandError("no local stack: start one with `prewarm local up`")


@dataclass
class LogSource:
    """One log file; `service`, when set, keeps only the JSON lines of that function."""

    label: str
    path: Path
    service: str | None = None
    offset: int = 0
    partial: bytes = field(default=b"", repr=False)

    @classmethod
    def of_agent(cls, logs_dir: Path, node: str) -> LogSource:
        from prewarm_devtools.node.agent import agent_output_path

        path = agent_output_path(logs_dir, node)
        if not path.exists():
            have = sorted(p.name.removeprefix(_AGENT_PREFIX).removesuffix(".log")
                          for p in logs_dir.glob(f"{_AGENT_PREFIX}*.log"))
            raise CommandError(f'no agent log for node "{node}" in {logs_dir} '
                               f"(agents with a log: {', '.join(have) or 'none'})")
        return cls(f"agent/{node}", path)

    @classmethod
    def of_function(cls, logs_dir: Path, name: str) -> LogSource:
        from prewarm_devtools.project import project_files

        known = sorted(p.name for p in project_files().functions.iterdir() if (p / "app.py").is_file())
        if name not in known:
            raise CommandError(f"unknown function {name!r}: choose one of {', '.join(known)}")
        return cls(f"function/{name}", logs_dir / FUNCTIONS_LOG, service=name)

    @classmethod
    def every(cls, logs_dir: Path) -> list[LogSource]:
        agents = sorted(logs_dir.glob(f"{_AGENT_PREFIX}*.log"))
        return [cls("functions", logs_dir / FUNCTIONS_LOG),
                *(cls("agent/" + p.name.removeprefix(_AGENT_PREFIX).removesuffix(".log"), p) for p in agents)]

    def keeps(self, line: str) -> bool:
        if self.service is None:
            return True
        try:
            doc = json.loads(line)
        except ValueError:
            return False
        return isinstance(doc, dict) and doc.get("service") == self.service

    def read_new(self) -> Iterator[str]:
        """The complete lines written since the last read (a line still being written waits), a chunk at a
        time: a log of days is never held whole."""
        try:
            f = self.path.open("rb")
        except FileNotFoundError:
            return
        with f:
            f.seek(self.offset)
            while data := f.read(_CHUNK):
                self.offset += len(data)
                *lines, self.partial = (self.partial + data).split(b"\n")
                yield from (text for raw in lines
                            if (text := raw.decode("utf-8", errors="replace")) and self.keeps(text))


def follow_logs(sources: list[LogSource], *, follow: bool, prefix: bool, alive: Callable[[], bool],
                interval: float = 0.2) -> None:
    """Prints every source's lines; with `follow`, keeps printing new ones until the stack stops."""
    while True:
        running = alive()
        for source in sources:
            for line in source.read_new():
                click.echo(f"{source.label} | {line}" if prefix else line)
        if not follow or not running:  # a stack that stopped has written its last lines
            return
        time.sleep(interval)
