"""How the `prewarm` CLI finds the stack it operates: a local stack's state file, or a CloudFormation stack.

A local stack (`prewarm local up`) records where it listens and the functions' shared environment in
a state file, `~/.prewarm/local.json` or the path in `PREWARM_LOCAL_STATE`:

    {"endpoint_url": "http://127.0.0.1:4566", "region": "us-west-2", "pid": 4242,
     "env": {"TABLE_NAME": "...", "STATUS_QUEUE_URL": "...", "NODE_QUEUE_PREFIX": "...", "NODE_DLQ_ARN": "..."}}

A deployed stack is found by name: its outputs (`JobsTableName`, `StatusQueueUrl`, `NodeQueuePrefix`,
`NodeDLQArn`) name the table and queues. boto3 is imported only when a target is built.
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
    from prewarm.adapters.dynamodb import DynamoJobStore
    from prewarm.adapters.sqs import NodeQueues

STATE_ENV = "PREWARM_LOCAL_STATE"
ENDPOINT_ENV = "PREWARM_ENDPOINT_URL"
STACK_ENV = "PREWARM_STACK"
DEFAULT_STATE_PATH = Path("~/.prewarm/local.json")

# Stack output → function environment variable it stands for.
STACK_OUTPUTS = {
    "JobsTableName": "TABLE_NAME",
    "StatusQueueUrl": "STATUS_QUEUE_URL",
    "NodeQueuePrefix": "NODE_QUEUE_PREFIX",
    "NodeDLQArn": "NODE_DLQ_ARN",
}
_REQUIRED_OUTPUTS = ("JobsTableName", "StatusQueueUrl", "NodeQueuePrefix")
# Local stacks accept any credentials; fixed ones keep real ones from ever being sent to them.
_LOCAL_CREDENTIALS = {"aws_access_key_id": "local", "aws_secret_access_key": "local"}


class TargetError(Exception):
    """No usable stack to operate on; the message says what to pass or start. Exit code 2 is a usage problem."""

    def __init__(self, message: str, *, exit_code: int = 1) -> None:
        super().__init__(message)
        self.exit_code = exit_code


# --- The local state file ------------------------------------------------------------------------


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
        """The state of a deployed `prewarm_local.stack.LocalStack` (anything with endpoint_url, region, env())."""
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


# --- Targets -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Target:
    """The table and queues of one stack, and how to reach them."""

    description: str
    table_name: str
    status_queue_url: str
    node_queue_prefix: str
    node_dlq_arn: str = ""
    node_queue_sender_arns: tuple[str, ...] = ()
    region: str | None = None
    endpoint_url: str | None = None
    local: bool = False

    def session(self) -> Any:
        import boto3

        credentials = _LOCAL_CREDENTIALS if self.local else {}
        return boto3.session.Session(region_name=self.region, **credentials)

    def client(self, service: str) -> Any:
        from botocore.config import Config

        # A CLI should fail in seconds, not retry for a minute, when the endpoint is down.
        config = Config(retries={"mode": "standard", "max_attempts": 3}, connect_timeout=3 if self.local else 10,
                        read_timeout=30, max_pool_connections=32)
        return self.session().client(service, endpoint_url=self.endpoint_url, config=config)

    def store(self) -> DynamoJobStore:
        from prewarm.adapters.dynamodb import DynamoJobStore

        return DynamoJobStore(self.table_name, client=self.client("dynamodb"))

    def queues(self) -> NodeQueues:
        from prewarm.adapters.sqs import NodeQueues

        # Queues a cancel has to create get the same redrive and policy as the control plane's.
        return NodeQueues(self.node_queue_prefix, self.status_queue_url, dlq_arn=self.node_dlq_arn,
                          sender_arns=self.node_queue_sender_arns, client=self.client("sqs"))


def target_from_env(env: Mapping[str, str], *, description: str, region: str | None, endpoint_url: str | None,
                    local: bool) -> Target:
    """A target from the functions' environment variables (TABLE_NAME, STATUS_QUEUE_URL, ...)."""
    from prewarm.settings import Settings, SettingsError

    try:
        settings = Settings.from_env(env)
    except SettingsError as e:
        raise TargetError(f"{description}: {e}") from None
    return Target(
        description=description, table_name=settings.table_name, status_queue_url=settings.status_queue_url,
        node_queue_prefix=settings.node_queue_prefix, node_dlq_arn=settings.node_dlq_arn,
        node_queue_sender_arns=tuple(settings.node_queue_sender_arns), region=region,
        endpoint_url=endpoint_url, local=local,
    )


def local_target(state: LocalState, *, endpoint_url: str | None = None, region: str | None = None) -> Target:
    """The local stack of `state`; `endpoint_url` and `region` override what the state file says."""
    if not state.running:
        raise TargetError(
            f"the local stack (pid {state.pid}) is not running any more; start it again with `prewarm local up`"
        )
    endpoint = endpoint_url or state.endpoint_url
    return target_from_env(state.env, description=f"local stack at {endpoint}", region=region or state.region,
                           endpoint_url=endpoint, local=True)


def stack_target(stack_name: str, *, region: str | None = None, cloudformation: Any = None) -> Target:
    """A deployed stack, found by its CloudFormation name; its outputs name the table and queues."""
    from botocore.exceptions import ClientError, NoRegionError

    try:
        client = cloudformation
        if client is None:
            import boto3

            client = boto3.session.Session(region_name=region).client("cloudformation")
        stacks = client.describe_stacks(StackName=stack_name)["Stacks"]
    except NoRegionError:
        raise TargetError(
            f"no AWS region to look up stack {stack_name!r} in: pass --region or set AWS_REGION", exit_code=2
        ) from None
    except ClientError as e:
        message = e.response.get("Error", {}).get("Message", str(e))
        if "does not exist" in message:
            raise TargetError(f"stack {stack_name!r} not found in {client.meta.region_name}") from None
        raise TargetError(f"cannot read stack {stack_name!r}: {message}") from None
    outputs = {o["OutputKey"]: o.get("OutputValue", "") for o in stacks[0].get("Outputs", [])}
    missing = [key for key in _REQUIRED_OUTPUTS if not outputs.get(key)]
    if missing:
        raise TargetError(
            f"stack {stack_name!r} has no output {', '.join(missing)}: is it a Prewarm stack, fully deployed?"
        )
    env = {variable: outputs[key] for key, variable in STACK_OUTPUTS.items() if outputs.get(key)}
    actual_region = client.meta.region_name
    return target_from_env(env, description=f"stack {stack_name} ({actual_region})", region=actual_region,
                           endpoint_url=None, local=False)


def resolve_target(
    *,
    local: bool = False,
    stack: str | None = None,
    region: str | None = None,
    environ: Mapping[str, str] | None = None,
) -> Target:
    """The stack the CLI operates, by precedence: `--local`, `--stack`, `PREWARM_STACK`,
    `PREWARM_ENDPOINT_URL` (a local stack on that endpoint), and last a local stack's state file if one exists.
    """
    env = os.environ if environ is None else environ
    if local and stack:
        raise TargetError("--local and --stack exclude each other: choose one target", exit_code=2)
    endpoint = env.get(ENDPOINT_ENV) or None
    if stack:
        return stack_target(stack, region=region)
    if local:
        return local_target(read_local_state(local_state_path(env)), endpoint_url=endpoint, region=region)
    env_stack = env.get(STACK_ENV)
    if env_stack and endpoint:
        raise TargetError(f"both {STACK_ENV} and {ENDPOINT_ENV} are set: unset one, or pass --stack or --local",
                          exit_code=2)
    if env_stack:
        return stack_target(env_stack, region=region)
    path = local_state_path(env)
    if endpoint or path.exists():
        return local_target(read_local_state(path), endpoint_url=endpoint, region=region)
    raise TargetError(
        f"no stack to talk to: pass --stack NAME (or set {STACK_ENV}) for a deployed stack, "
        "or start a local one with `prewarm local up`",
        exit_code=2,
    )
