"""AWS on this machine: moto's `ThreadedMotoServer` on 127.0.0.1, started and stopped in-process.

The server answers within AWS's limits (`prewarm_devtools.aws_limits`): on by default, off with
`MotoServer(limits=False)` or `PREWARM_AWS_LIMITS=off`. A layer already in force (a test's own
quotas, the pytest plugin's) is kept as it is.

Each local process has its principal, known to the layer by its access key id (`LocalIdentity`): the
operator (the CLI, tests, the stack's own event plumbing) signs with `OPERATOR`'s key, each function
with its role's (`LocalStack.invoke`), the agents with their role's (`LocalMode`). The roles come with
their identity policies from `template.yaml`, and IAM's evaluation holds for them as on AWS; the
operator, an administrator, is held to resource policies' explicit denies only; a key the layer does
not know is moto's default caller, for which nothing is evaluated.
"""

from __future__ import annotations

import hashlib
import logging
import os
from collections.abc import Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from prewarm_devtools.account import ACCOUNT, REGION

if TYPE_CHECKING:
    from prewarm_devtools.aws_limits import AwsLimits, Quotas

__all__ = ["ACCOUNT", "OPERATOR", "REGION", "LocalIdentity", "MotoServer", "aws_environment", "patched_environ"]


@dataclass(frozen=True)
class LocalIdentity:
    """A local principal: its ARN and the access key it signs with (the secret is not checked)."""

    arn: str
    access_key_id: str
    secret_access_key: str = "local"

    @classmethod
    def of_role(cls, arn: str, kind: str = "FN") -> LocalIdentity:
        """The identity of a role, its key derived from the ARN (so every process derives the same one).

        >>> LocalIdentity.of_role("arn:aws:iam::123456789012:role/prewarm-local-SweepRole").access_key_id[:7]
        'LOCALFN'
        """
        digest = hashlib.sha256(arn.encode()).hexdigest()[:13].upper()
        return cls(arn, f"LOCAL{kind}{digest}")

    def environment(self) -> dict[str, str]:
        """The variables that make boto3 sign as this identity."""
        return {"AWS_ACCESS_KEY_ID": self.access_key_id, "AWS_SECRET_ACCESS_KEY": self.secret_access_key}

    def register(self, policies: Sequence[Mapping[str, Any]] | None = None) -> None:
        """Makes the layer in force (if any) know this key as this principal; with `policies`, those are
        all its identity policies, and IAM's evaluation applies to it (`aws_limits.policy`)."""
        from prewarm_devtools import aws_limits

        if (layer := aws_limits.active()) is not None:
            layer.principals.add(self.access_key_id, self.arn, policies)

    def unregister(self) -> None:
        """Makes this key moto's default caller again, for whatever runs after."""
        from prewarm_devtools import aws_limits

        if (layer := aws_limits.active()) is not None:
            layer.principals.remove(self.access_key_id)


# The person at the keyboard: the CLI's local target, tests' clients and the local stack's own plumbing.
OPERATOR = LocalIdentity(f"arn:aws:iam::{ACCOUNT}:user/operator", "local", "local")


class MotoServer:
    """A moto server on a free 127.0.0.1 port. `url` is its endpoint; `client(name)` a boto3 client for it.

    `limits`: True (default unless `PREWARM_AWS_LIMITS=off`) puts AWS's limits in force with AWS's
    quotas, a `Quotas` with those; `layer` is the layer in force while the server runs.
    """

    def __init__(self, region: str = REGION, *, limits: bool | Quotas | None = None) -> None:
        from moto.server import ThreadedMotoServer

        # One line per request otherwise: the server is chatty at INFO.
        logging.getLogger("werkzeug").setLevel(logging.ERROR)
        self.region = region
        self._server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
        self.url = ""
        from prewarm_devtools import aws_limits

        self._limits = aws_limits.wanted() if limits is None else limits
        self._own_layer = False
        self.layer: AwsLimits | None = None

    def start(self) -> MotoServer:
        from prewarm_devtools import aws_limits

        self.layer = aws_limits.active()
        if self.layer is None and self._limits:
            self.layer = aws_limits.enable(None if self._limits is True else self._limits)
            self._own_layer = True
        OPERATOR.register()
        self._server.start()
        host, port = self._server.get_host_and_port()
        self.url = f"http://{host}:{port}"
        # moto keeps its state per process, not per server: start each server empty.
        import urllib.request

        urllib.request.urlopen(urllib.request.Request(f"{self.url}/moto-api/reset", method="POST"), timeout=10).close()
        return self

    def stop(self) -> None:
        self._server.stop()
        OPERATOR.unregister()
        if self._own_layer:
            from prewarm_devtools import aws_limits

            aws_limits.disable()
            self._own_layer = False

    def __enter__(self) -> MotoServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def client(self, service: str, region_name: str | None = None) -> Any:
        import boto3

        return boto3.client(service, region_name=region_name or self.region, endpoint_url=self.url,
                            aws_access_key_id=OPERATOR.access_key_id,
                            aws_secret_access_key=OPERATOR.secret_access_key)


@contextmanager
def patched_environ(values: Mapping[str, str]) -> Iterator[None]:
    """Sets `values` in `os.environ` for the block, then puts back what was there before."""
    saved = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def aws_environment(url: str, region: str = REGION) -> AbstractContextManager[None]:
    """Points boto3 in this process at the local endpoint (restored on exit)."""
    return patched_environ({"AWS_ENDPOINT_URL": url, "AWS_DEFAULT_REGION": region, "AWS_REGION": region,
                            **OPERATOR.environment()})
