"""An ECR token carries the pull permissions of whoever asked for it. When the registry refuses the node's
first credential (the refresher's shared copy), the pull goes on with the agent's own role's token, asked
for only then, and the log and a failed pull's message name both principals."""

from __future__ import annotations

import base64
import logging
from datetime import UTC, datetime

import pytest

from prewarm.adapters.ecr_auth import EcrTokenSource
from prewarm.adapters.secrets import RegistryCopy
from prewarm.domain.refresh import registry_secret_name
from prewarm.domain.registries import Keyring, RegistryAuth
from prewarm_agent.attempts import TaskRunner
from prewarm_agent.credentials import EcrTokens, RegistryCopies, RegistryCredentials
from prewarm_agent.cri.errors import ImagePullError
from prewarm_agent.pulls import PullCoordinator
from tests.support.agent import IMAGE_ID, FakeDisk, FakeRuntime, RecordedEvents, make_run, make_task
from tests.support.clock import Clock

ACCOUNT = "123456789012"
HOST = f"{ACCOUNT}.dkr.ecr.us-west-2.amazonaws.com"
IMAGE = f"{HOST}/team/api:v1"
PREFIX = "prewarm/prod"
REFRESHER = f"arn:aws:iam::{ACCOUNT}:role/prod-RefreshEcrCredentialsRole"
AGENT = f"arn:aws:sts::{ACCOUNT}:assumed-role/prod-agent/i-0abc"
FORBIDDEN = (f'failed to pull and unpack image "{IMAGE}": failed to resolve reference "{IMAGE}": pulling from host '
             f"{HOST} failed with status code [manifests v1]: 403 Forbidden")


class Copies:
    """The refresher's copy of the registry's token, issued to its role."""

    def __init__(self) -> None:
        self.read = 0

    def registry_copy(self, prefix: str, host: str) -> RegistryCopy:
        self.read += 1
        ring = Keyring([RegistryAuth("AWS", "refresher-token", host)])
        return RegistryCopy(registry_secret_name(prefix, host), ring, None, None, issued_to=REFRESHER)


class Ecr:
    """ECR and STS as the agent's role sees them: its token, and who it is."""

    def __init__(self) -> None:
        self.tokens = 0

    def get_authorization_token(self, **_: object) -> dict[str, object]:
        self.tokens += 1
        return {"authorizationData": [{"authorizationToken": base64.b64encode(b"AWS:agent-token").decode(),
                                       "expiresAt": datetime(2100, 1, 1, tzinfo=UTC)}]}

    def get_caller_identity(self) -> dict[str, str]:
        return {"Arn": AGENT}


def forbidden() -> ImagePullError:
    return ImagePullError(f"pulling {IMAGE} failed: {FORBIDDEN}", code="UNKNOWN", details=FORBIDDEN, image=IMAGE)


def runner(outcomes: list[object]) -> tuple[TaskRunner, FakeRuntime, Copies, Ecr]:
    clock, copies, ecr = Clock(), Copies(), Ecr()
    source = EcrTokenSource(client_factory=lambda *_: ecr, clock=clock.time, identify_caller=True)
    credentials = RegistryCredentials(
        secrets=_NoSecrets(), copies=RegistryCopies(copies, PREFIX, clock=clock.time, random=lambda: 0.5),
        tokens=EcrTokens(clock=clock.time, source=source), copies_first=True)
    runtime = FakeRuntime(outcomes)
    task_runner = TaskRunner(runtime=runtime, pulls=PullCoordinator(2, clock), credentials=credentials,
                             disk=FakeDisk(), clock=clock, events=RecordedEvents())
    return task_runner, runtime, copies, ecr


class _NoSecrets:
    def keyring(self, secret_ids: object) -> Keyring:
        return Keyring()


def test_a_pull_with_the_shared_copy_asks_nothing_of_ecr() -> None:
    task_runner, runtime, copies, ecr = runner([IMAGE_ID])

    final = task_runner.run(make_run(make_task(IMAGE, backoff_limit=0)))

    assert final.phase == "Succeeded"
    assert [p.auth for p in runtime.pulls] == [("AWS", "refresher-token")]
    assert (copies.read, ecr.tokens) == (1, 0)


def test_a_refused_shared_copy_falls_back_to_the_agents_own_role_and_the_log_names_both(
    caplog: pytest.LogCaptureFixture,
) -> None:
    task_runner, runtime, _, ecr = runner([forbidden(), IMAGE_ID])

    with caplog.at_level(logging.WARNING, logger="prewarm_agent.attempts"):
        final = task_runner.run(make_run(make_task(IMAGE, backoff_limit=0)))

    assert final.phase == "Succeeded"
    assert [p.auth for p in runtime.pulls] == [("AWS", "refresher-token"), ("AWS", "agent-token")]
    assert ecr.tokens == 1
    (line,) = [r.getMessage() for r in caplog.records if "refused" in r.getMessage()]
    assert line == (f"the registry refused the shared credential {PREFIX}/registry/{HOST} (issued to {REFRESHER}) "
                    f"for {IMAGE}; pulling with the agent's own role ({AGENT}) instead")


def test_when_both_are_refused_the_failed_pull_names_both_principals() -> None:
    task_runner, runtime, _, _ = runner([forbidden(), forbidden()])

    final = task_runner.run(make_run(make_task(IMAGE, backoff_limit=0)))

    assert final.phase == "Failed"
    assert len(runtime.pulls) == 2
    assert final.message == (f"{FORBIDDEN} (the registry refused the shared credential {PREFIX}/registry/{HOST} "
                             f"(issued to {REFRESHER}) and the agent's own role ({AGENT}))")


def test_an_error_that_is_not_a_refusal_does_not_fall_back() -> None:
    not_found = ImagePullError("not found", details=f"{IMAGE}: not found", image=IMAGE)
    task_runner, runtime, _, ecr = runner([not_found])

    final = task_runner.run(make_run(make_task(IMAGE, backoff_limit=0)))

    assert final.message == f"{IMAGE}: not found"
    assert (len(runtime.pulls), ecr.tokens) == (1, 0)
