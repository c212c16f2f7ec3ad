"""Registry credentials fan in: a fleet's agents read the refresher's copy of each registry's token, and
`ecr:GetAuthorizationToken` is a throttle-aware fallback only. Counted call by call on the clients."""

from __future__ import annotations

import base64
import random
from collections import Counter
from datetime import UTC, datetime
from typing import Any

import pytest
from botocore.exceptions import ClientError

from prewarm.adapters.ecr_auth import EcrTokenSource
from prewarm.adapters.secrets import AgentCredentials, SecretsManagerCredentialStore
from prewarm.domain.images import parse_image
from prewarm.domain.refresh import CredentialsConfig, RegistryConfig
from prewarm.domain.registries import EcrRegistry, parse_ecr_registry
from prewarm.services.credentials import refresh_credentials
from prewarm.services.ports import RegistryTokenError
from prewarm_agent.credentials import (
    COPY_EXPIRY_MARGIN_SECONDS,
    COPY_JITTER_SECONDS,
    COPY_RECHECK_SECONDS,
    COPY_REFRESH_GRACE_SECONDS,
    TOKEN_PAUSE_SECONDS,
    TOKEN_TRIES,
    EcrTokens,
    RegistryCredentials,
    copy_kept_until,
    registry_credentials,
)
from prewarm_agent.settings import AgentSettings
from prewarm_devtools.aws_limits.counting import TokenBucket
from tests.support.clock import HOUR, Clock

ACCOUNT = "123456789012"
ECR_HOST = f"{ACCOUNT}.dkr.ecr.us-west-2.amazonaws.com"
IMAGE = parse_image(f"{ECR_HOST}/team/api:v1")
PREFIX = "prewarm/prod"
AGENTS = 1000
SETTINGS = {
    "NODE_QUEUE_PREFIX": "prewarm-node", "AWS_REGION": "us-west-2", "SECRET_PREFIX": PREFIX,
    "STATUS_QUEUE_URL": "https://sqs.us-west-2.amazonaws.com/123456789012/prewarm-status",
}


def throttled(operation: str = "GetAuthorizationToken") -> ClientError:
    return ClientError({"Error": {"Code": "ThrottlingException", "Message": "Rate exceeded"}}, operation)


class CountingEcr:
    """ECR's GetAuthorizationToken, counted, at its rate of before 2020 (20 a second, bursts of 200; the
    quota is 500 a second now): the stricter one, on the test's clock.

    It answers a token valid for 12 hours from now, as real ECR does: moto's fixed token expired in
    2015, and a copy of it would be refused by every agent as expired."""

    def __init__(self, clock: Clock) -> None:
        self.clock = clock
        self.calls = 0
        self.refused = 0
        self.bucket = TokenBucket(20, 200, clock.now)

    def get_authorization_token(self, **_: Any) -> dict[str, Any]:
        self.calls += 1
        if not self.bucket.can_take(1, self.clock.now):
            self.refused += 1
            raise throttled()
        self.bucket.take(1, self.clock.now)
        token = base64.b64encode(f"AWS:token-{self.calls}".encode()).decode()
        expires = datetime.fromtimestamp(self.clock.now + 12 * HOUR, UTC)
        return {"authorizationData": [{"authorizationToken": token, "expiresAt": expires}]}


class SecretsManager:
    """Secrets Manager's secrets in memory; `client(who)` counts each caller's requests apart."""

    def __init__(self) -> None:
        self.values: dict[str, str] = {}
        self.requests: Counter[tuple[str, str]] = Counter()

    def client(self, who: str) -> SecretsManagerClient:
        return SecretsManagerClient(self, who)


class SecretsManagerClient:
    def __init__(self, store: SecretsManager, who: str) -> None:
        self.store = store
        self.who = who

    def _count(self, operation: str) -> None:
        self.store.requests[(self.who, operation)] += 1

    @staticmethod
    def _name(secret_id: str) -> str:
        return secret_id.removeprefix("arn:aws:secretsmanager:us-west-2:123456789012:secret:")

    def get_secret_value(self, SecretId: str) -> dict[str, Any]:
        self._count("GetSecretValue")
        name = self._name(SecretId)
        if name not in self.store.values:
            raise ClientError({"Error": {"Code": "ResourceNotFoundException", "Message": "not found"}},
                              "GetSecretValue")
        return {"ARN": f"arn:aws:secretsmanager:us-west-2:123456789012:secret:{name}",
                "SecretString": self.store.values[name]}

    def create_secret(self, Name: str, SecretString: str, **_: Any) -> dict[str, Any]:
        self._count("CreateSecret")
        self.store.values[Name] = SecretString
        return {"ARN": f"arn:aws:secretsmanager:us-west-2:123456789012:secret:{Name}"}

    def put_secret_value(self, SecretId: str, SecretString: str) -> dict[str, Any]:
        self._count("PutSecretValue")
        self.store.values[self._name(SecretId)] = SecretString
        return {}

    def tag_resource(self, **_: Any) -> dict[str, Any]:
        self._count("TagResource")
        return {}


class Fleet:
    """The refresher and `AGENTS` agents (each with its own caches and jitter) on one clock, one ECR and
    one Secrets Manager."""

    def __init__(self, clock: Clock, env: dict[str, str] | None = None) -> None:
        self.clock = clock
        self.ecr = CountingEcr(clock)
        self.secrets = SecretsManager()
        self.config = CredentialsConfig(registries=(RegistryConfig(account=ACCOUNT, region="us-west-2"),))
        self.waits: list[float] = []
        agent_reads = self.secrets.client("agents")
        self.agents: list[RegistryCredentials] = []
        for index in range(AGENTS):
            settings = AgentSettings.from_env({**SETTINGS, "NODE_NAME": f"node-{index}", **(env or {})})
            self.agents.append(registry_credentials(
                settings, secrets=AgentCredentials(client=agent_reads, clock=clock.time), clock=clock.time,
                token_source=EcrTokenSource(client_factory=lambda *_: self.ecr, clock=clock.time),
                wait=self.wait, random=random.Random(index).random,
            ))

    def wait(self, seconds: float) -> None:
        self.waits.append(seconds)
        self.clock.advance(seconds)

    def refresh(self) -> None:
        """One run of refresh_ecr_credentials."""
        store = SecretsManagerCredentialStore(PREFIX, client=self.secrets.client("refresher"))
        tokens = EcrTokenSource(client_factory=lambda *_: self.ecr, clock=self.clock.time)
        report = refresh_credentials(self.config, None, tokens, store, clock=self.clock.time)
        report.raise_for_failures()

    def pull(self) -> set[str]:
        """Every agent gathers the credentials of an ECR image; returns the node credentials they got."""
        got = set()
        for agent in self.agents:
            found = agent.candidates(IMAGE, [])
            assert found.problems == []
            got.update(auth.password for auth in found.auths if auth is not None)
        return got

    @property
    def agent_reads(self) -> int:
        return self.secrets.requests[("agents", "GetSecretValue")]


def test_a_first_pull_on_1000_agents_makes_one_get_authorization_token_call_the_refreshers() -> None:
    # Given the refresher's run, and 1,000 agents with the default settings and the stack's SECRET_PREFIX
    fleet = Fleet(Clock())
    fleet.refresh()

    # When every agent makes its first pull from the registry at the same moment
    got = fleet.pull()

    # Then ECR was asked once, by the refresher; the agents read its copy, once each
    assert fleet.ecr.calls == 1
    assert got == {"token-1"}
    assert fleet.agent_reads == AGENTS
    # ... and pulls right after are served from each agent's cache
    fleet.clock.advance(600)
    fleet.pull()
    assert (fleet.ecr.calls, fleet.agent_reads) == (1, AGENTS)


def test_over_a_day_ecr_is_asked_once_per_refresh_period_and_each_agent_reads_each_copy_once() -> None:
    # Given a fleet whose refresher runs hourly, and agents pulling from the registry every 30 minutes
    fleet = Fleet(Clock())
    copies_written = 0
    reads_per_half_hour = []

    # When a day passes
    for half_hour in range(48):
        if half_hour % 2 == 0:
            before = fleet.secrets.requests[("refresher", "PutSecretValue")] + fleet.secrets.requests[
                ("refresher", "CreateSecret")]
            fleet.refresh()
            copies_written += fleet.secrets.requests[("refresher", "PutSecretValue")] + fleet.secrets.requests[
                ("refresher", "CreateSecret")] - before
        reads = fleet.agent_reads
        fleet.pull()
        reads_per_half_hour.append(fleet.agent_reads - reads)
        fleet.clock.advance(HOUR / 2)

    # Then ECR answered one call per copy written: a copy every 6 hours (half a 12-hour token's life)
    assert copies_written == 4
    assert fleet.ecr.calls == copies_written
    assert fleet.ecr.refused == 0
    # ... every agent read each copy once
    assert fleet.agent_reads == AGENTS * copies_written
    # ... and the re-reads of a new copy were spread over the jitter window, never all at once
    assert max(reads_per_half_hour[1:]) < AGENTS * 0.6


def test_agents_reread_a_copy_after_the_refresher_replaced_it_each_at_its_own_time() -> None:
    # An agent keeps a copy past its half-life plus the refresher's schedule, plus its jitter ...
    assert copy_kept_until(0.0, 12 * HOUR, read_at=60.0, jitter=0.0) == 6 * HOUR + COPY_REFRESH_GRACE_SECONDS
    latest = copy_kept_until(0.0, 12 * HOUR, read_at=60.0, jitter=0.999)
    assert 6 * HOUR + COPY_REFRESH_GRACE_SECONDS < latest < 6 * HOUR + COPY_REFRESH_GRACE_SECONDS + COPY_JITTER_SECONDS
    # ... looks again soon when the refresher is late or the copy has no times ...
    late = 8 * HOUR
    assert copy_kept_until(0.0, 12 * HOUR, read_at=late, jitter=0.5) == late + 1.5 * COPY_RECHECK_SECONDS
    assert copy_kept_until(None, None, read_at=late, jitter=0.0) == late + COPY_RECHECK_SECONDS
    # ... and never keeps one into its last minutes
    assert copy_kept_until(0.0, HOUR, read_at=0.0, jitter=0.9) <= HOUR - COPY_EXPIRY_MARGIN_SECONDS
    assert copy_kept_until(0.0, HOUR, read_at=HOUR - 30, jitter=0.9) == HOUR


def test_without_a_copy_the_fleet_asks_ecr_throttle_aware_and_never_twice_in_a_burst() -> None:
    # Given 1,000 agents whose refresher has written no copy yet
    fleet = Fleet(Clock())

    # When every agent makes its first pull at the same moment
    results = [agent.candidates(IMAGE, []) for agent in fleet.agents]

    # Then the first 200 got tokens within ECR's burst; the rest were throttled and backed off with
    # jitter: TOKEN_TRIES calls each at the most, every wait a random share of the doubling backoff
    served = [r for r in results if any(a is not None for a in r.auths)]
    assert len(served) >= 200
    assert fleet.ecr.calls <= 200 + (AGENTS - 200) * TOKEN_TRIES
    assert fleet.waits and all(0 <= w <= 8 for w in fleet.waits) and len(set(fleet.waits)) == len(fleet.waits)
    # ... an agent left without a token says why, with both sources named
    for result in results:
        if result not in served:
            assert any("no registry copy" in p for p in result.problems)
            assert any("ThrottlingException" in p for p in result.problems)
    # ... and pauses: its next pull does not ask ECR again
    calls = fleet.ecr.calls
    for agent, result in zip(fleet.agents, results, strict=True):
        if result not in served:
            again = agent.candidates(IMAGE, [])
            assert any("not asking again before" in p for p in again.problems)
    assert fleet.ecr.calls == calls


@pytest.fixture
def ecr() -> EcrRegistry:
    registry = parse_ecr_registry(ECR_HOST)
    assert registry is not None
    return registry


class ScriptedSource:
    """Token answers in turn: an exception to raise, or a password to answer."""

    def __init__(self, clock: Clock, answers: list[Exception | str]) -> None:
        self.clock = clock
        self.answers = answers
        self.calls = 0

    def token(self, registry: RegistryConfig) -> Any:
        from prewarm.domain.refresh import RegistryToken

        self.calls += 1
        answer = self.answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return RegistryToken.for_hosts("AWS", answer, registry.hosts, issued_at=self.clock.now,
                                       expires_at=self.clock.now + 12 * HOUR)


def throttle_error() -> RegistryTokenError:
    try:
        raise throttled()
    except ClientError as cause:
        try:
            raise RegistryTokenError(ECR_HOST, "ecr:GetAuthorizationToken: ThrottlingException: Rate exceeded") \
                from cause
        except RegistryTokenError as e:
            return e


def test_a_throttled_token_request_is_retried_after_a_jittered_backoff(ecr: EcrRegistry) -> None:
    clock = Clock()
    waits: list[float] = []
    source = ScriptedSource(clock, [throttle_error(), throttle_error(), "token"])
    tokens = EcrTokens(clock=clock.time, source=source, wait=waits.append, random=lambda: 0.5)

    auth = tokens.auth(ecr, ECR_HOST)

    assert (auth.password, source.calls) == ("token", 3)
    # full jitter: random() times 1 s, then times 2 s
    assert waits == [0.5, 1.0]


def test_a_refusal_pauses_the_roles_asking_for_a_jittered_minute(ecr: EcrRegistry) -> None:
    clock = Clock()
    denied = RegistryTokenError(ECR_HOST, "ecr:GetAuthorizationToken: AccessDeniedException: no")
    source = ScriptedSource(clock, [denied, "token"])
    tokens = EcrTokens(clock=clock.time, source=source, wait=lambda _: None, random=lambda: 0.5)

    with pytest.raises(RegistryTokenError):
        tokens.auth(ecr, ECR_HOST)
    clock.advance(TOKEN_PAUSE_SECONDS - 1)
    with pytest.raises(RegistryTokenError, match="AccessDeniedException: no; not asking again before"):
        tokens.auth(ecr, ECR_HOST)
    assert source.calls == 1
    clock.advance(1)

    assert tokens.auth(ecr, ECR_HOST).password == "token"
    assert source.calls == 2


def test_an_unusable_copy_falls_back_to_the_role_and_is_looked_for_again_only_after_a_while() -> None:
    # Given the default settings, a role ECR serves, and no copy (the refresher has not run yet)
    fleet = Fleet(Clock())
    agent = fleet.agents[0]

    # When the agent pulls twice in a row
    first = agent.candidates(IMAGE, [])
    second = agent.candidates(IMAGE, [])

    # Then the role's token serves both, and the missing copy was looked for once and is no problem
    assert [a.password for a in first.auths if a] == ["token-1"] == [a.password for a in second.auths if a]
    assert (first.problems, fleet.ecr.calls, fleet.agent_reads) == ([], 1, 1)
    # ... and once the refresher wrote it and the recheck time passed, the copy is used
    fleet.refresh()
    fleet.clock.advance(2 * COPY_RECHECK_SECONDS)
    assert [a.password for a in agent.candidates(IMAGE, []).auths if a] == ["token-2"]
    assert fleet.agent_reads == 2
