"""A local stack (`prewarm local up`) records where it listens and the functions' shared environment in
a state file, `~/.prewarm/local.json` or the path in `PREWARM_LOCAL_STATE`:

    {"endpoint_url": "http://127.0.0.1:4566", "region": "us-west-2", "pid": 4242,
     "env": {"TABLE_NAME": "...", "STATUS_QUEUE_URL": "...", "NODE_QUEUE_PREFIX": "...", "NODE_DLQ_ARN": "..."}}
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    pass

from prewarm_cli.targets.target import Target, TargetError, target_from_env

STATE_ENV = "PREWARM_LOCAL_STATE"
DEFAULT_STATE_PATH = Path("~/.prewarm/local.json")




def local_state_path(environ: Mapping[str, str] | None = None) -> Path:
    """Where the local stack's state lives: `$PREWARM_LOCAL_STATE`, else `~/.prewarm/local.json`."""
    env = os.environ if environ is None else environ
    return Path(env.get(STATE_ENV) or DEFAULT_STATE_PATH).expanduser()


def _state_file(path: Path | str | None) -> Path:
    return Path(path).expanduser() if path is not None else local_state_path()


@dataclass(frozen=True)
class LocalState:
    """A running local stack: its AWS endpoint and region, and the functions' shared environment."""

    endpoint_url: str
    region: str
    env: dict[str, str] = field(default_factory=dict)
    pid: int | None = None

    @classmethod
    def of_stack(cls, stack: Any, *, pid: int | None = None) -> LocalState:
        """The state of a deployed local stack (anything with endpoint_url, region and env())."""
        return cls(endpoint_url=stack.endpoint_url, region=stack.region, env=dict(stack.env()), pid=pid)

    @property
    def running(self) -> bool:
        """Whether the stack's process is alive; a state without a pid counts as running."""
        return self.pid is None or process_alive(self.pid)

    def to_json(self) -> dict[str, Any]:
        doc: dict[str, Any] = {"endpoint_url": self.endpoint_url, "region": self.region, "env": dict(self.env)}
        if self.pid is not None:
            doc["pid"] = self.pid
        return doc

    @classmethod
    def from_json(cls, doc: Any, *, where: str = "local state") -> LocalState:
        if not isinstance(doc, Mapping):
            raise TargetError(f"{where}: expected a JSON object with endpoint_url, region and env")
        endpoint, region, env, pid = doc.get("endpoint_url"), doc.get("region"), doc.get("env", {}), doc.get("pid")
        if not isinstance(endpoint, str) or not endpoint:
            raise TargetError(f"{where}: endpoint_url must be a non-empty string")
        if not isinstance(region, str) or not region:
            raise TargetError(f"{where}: region must be a non-empty string")
        if not isinstance(env, Mapping) or not all(isinstance(k, str) and isinstance(v, str) for k, v in env.items()):
            raise TargetError(f"{where}: env must map variable names to strings")
        if pid is not None and (not isinstance(pid, int) or isinstance(pid, bool) or pid <= 0):
            raise TargetError(f"{where}: pid must be a positive integer")
        return cls(endpoint_url=endpoint, region=region, env=dict(env), pid=pid)


def write_local_state(state: LocalState, path: Path | str | None = None) -> Path:
    """Writes the state file atomically (readable by the owner only) and returns its path."""
    target = _state_file(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".local-", suffix=".json", dir=target.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(state.to_json(), f, indent=2, sort_keys=True)
            f.write("\n")
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return target


def read_local_state(path: Path | str | None = None) -> LocalState:
    """Reads the state file; `TargetError` says how to start a local stack when there is none."""
    source = _state_file(path)
    try:
        text = source.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise TargetError(
            f"no local stack: {source} does not exist; start one with `prewarm local up` "
            f"(or set {STATE_ENV} to its state file)"
        ) from None
    except OSError as e:
        raise TargetError(f"cannot read the local stack state {source}: {e.strerror}") from e
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as e:
        raise TargetError(f"{source}: not valid JSON ({e.msg} at line {e.lineno})") from None
    return LocalState.from_json(doc, where=str(source))


def clear_local_state(path: Path | str | None = None) -> bool:
    """Removes the state file (the local stack stopped); False when there was none."""
    target = _state_file(path)
    try:
        target.unlink()
    except FileNotFoundError:
        return False
    return True


def process_alive(pid: int) -> bool:
    """Whether a process of that id exists (the local stack's, named in its state file)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # someone else's process, but alive
    return True


def local_target(state: LocalState, *, endpoint_url: str | None = None, region: str | None = None) -> Target:
    """The local stack of `state`; `endpoint_url` and `region` override what the state file says."""
    if not state.running:
        raise TargetError(
            f"the local stack (pid {state.pid}) is not running any more; start it again with `prewarm local up`"
        )
    endpoint = endpoint_url or state.endpoint_url
    return target_from_env(state.env, description=f"local stack at {endpoint}", region=region or state.region,
                           endpoint_url=endpoint, local=True)


