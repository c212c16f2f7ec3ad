"""How the `prewarm` CLI finds the stack it operates: a local stack's state file, or a CloudFormation stack.

A local stack (`prewarm local up`) records where it listens and the functions' shared environment in
a state file, `~/.prewarm/local.json` or the path in `PREWARM_LOCAL_STATE`:

    {"endpoint_url": "http://127.0.0.1:4566", "region": "us-west-2", "pid": 4242,
     "env": {"TABLE_NAME": "...", "STATUS_QUEUE_URL": "...", "NODE_QUEUE_PREFIX": "...", "NODE_DLQ_ARN": "..."}}

A deployed stack is found by name: its outputs (`JobsTableName`, `StatusQueueUrl`, `NodeQueuePrefix`,
`NodeDLQArn`) name the table and queues. boto3 is imported only when a target is built.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from prewarm_cli.targets.local import (
    DEFAULT_STATE_PATH,
    STATE_ENV,
    LocalState,
    clear_local_state,
    local_state_path,
    local_target,
    process_alive,
    read_local_state,
    write_local_state,
)
from prewarm_cli.targets.stack import STACK_OUTPUTS, stack_target
from prewarm_cli.targets.target import Target, TargetError, target_from_env

ENDPOINT_ENV = "PREWARM_ENDPOINT_URL"
STACK_ENV = "PREWARM_STACK"

__all__ = [
    "DEFAULT_STATE_PATH", "ENDPOINT_ENV", "STACK_ENV", "STACK_OUTPUTS", "STATE_ENV", "LocalState", "Target",
    "TargetError", "clear_local_state", "local_state_path", "local_target", "process_alive", "read_local_state",
    "resolve_target", "stack_target", "target_from_env", "write_local_state",
]


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
