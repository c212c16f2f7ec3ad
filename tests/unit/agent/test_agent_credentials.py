"""Which credentials a pull tries, in which order, and the ECR token cache."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from prewarm.adapters.secrets import RegistryCopy
from prewarm.domain.images import parse_image
from prewarm.domain.refresh import RegistryConfig, RegistryToken, registry_secret_name
from prewarm.domain.registries import EcrRegistry, Keyring, RegistryAuth, parse_ecr_registry
from prewarm.services.ports import AgentCredentialsError, RegistryTokenError
from prewarm_agent.credentials import (
    EcrTokens,
    RegistryCopies,
    RegistryCopyError,
    RegistryCredentials,
    credential_identity,
    credential_order,
    registry_credentials,
)
from prewarm_agent.settings import AgentSettings

ECR_HOST = "123456789012.dkr.ecr.us-west-2.amazonaws.com"
ECR_IMAGE = f"{ECR_HOST}/team/api:v1"


def keyring(entries: dict[str, tuple[str, str]]) -> Keyring:
    return Keyring(RegistryAuth(user, password, server) for server, (user, password) in entries.items())


def test_pull_secrets_come_first_most_specific_key_first_then_the_nodes_token() -> None:
    secrets = keyring({ECR_HOST: ("ci", "broad"), f"{ECR_HOST}/team": ("ci", "narrow")})
    node_token = RegistryAuth("AWS", "token", ECR_HOST)

    order = credential_order(ECR_IMAGE, secrets, node_token)

    assert [(a.username, a.password) for a in order if a] == [("ci", "narrow"), ("ci", "broad"), ("AWS", "token")]


def test_anonymous_only_when_nothing_matches() -> None:
    secrets = keyring({"quay.io": ("q", "p")})

    assert credential_order(ECR_IMAGE, secrets, None) == [None]
    assert None not in credential_order(ECR_IMAGE, secrets, RegistryAuth("AWS", "t", ECR_HOST))


def test_the_same_user_and_password_is_tried_once() -> None:
    secrets = keyring({ECR_HOST: ("AWS", "same"), f"{ECR_HOST}/team": ("AWS", "same")})

    order = credential_order(ECR_IMAGE, secrets, RegistryAuth("AWS", "same", ECR_HOST))

    assert len(order) == 1


def test_credential_identity_hides_the_password_and_tells_credentials_apart() -> None:
    one = credential_identity(RegistryAuth("ci", "s3cret-password", "r"))

    assert "s3cret" not in one
    assert one == credential_identity(RegistryAuth("ci", "s3cret-password", "other-server"))
    assert one != credential_identity(RegistryAuth("ci", "other", "r"))
    assert credential_identity(None) == "anonymous"


class FakeSecrets:
    def __init__(self, rings: dict[str, Keyring | Exception]) -> None:
        self.rings = rings

    def keyring(self, secret_ids: Sequence[str]) -> Keyring:
        (secret_id,) = secret_ids
        found = self.rings[secret_id]
        if isinstance(found, Exception):
            raise found
        return found


class FakeTokens:
    def __init__(self, error: Exception | None = None) -> None:
        self.error = error
        self.asked: list[tuple[EcrRegistry, str]] = []

    def auth(self, registry: EcrRegistry, host: str) -> RegistryAuth:
        self.asked.append((registry, host))
        if self.error is not None:
            raise self.error
        return RegistryAuth("AWS", "ecr-token", host)


def test_secrets_are_merged_in_the_tasks_order_and_unreadable_ones_are_named() -> None:
    secrets = FakeSecrets({
        "arn:1": keyring({ECR_HOST: ("first", "1")}),
        "arn:gone": AgentCredentialsError("secret arn:gone does not exist (or is being deleted)"),
        "arn:2": keyring({ECR_HOST: ("second", "2")}),
    })
    credentials = RegistryCredentials(secrets=secrets, tokens=FakeTokens())

    found = credentials.candidates(parse_image(ECR_IMAGE), ["arn:1", "arn:gone", "arn:2", "arn:1"])

    assert [a.username for a in found.auths if a] == ["first", "second", "AWS"]
    assert found.problems == ["secret arn:gone does not exist (or is being deleted)"]


def test_an_ecr_token_is_asked_only_for_ecr_hosts() -> None:
    tokens = FakeTokens()
    credentials = RegistryCredentials(secrets=FakeSecrets({}), tokens=tokens)

    assert credentials.candidates(parse_image("quay.io/team/app:v1"), []).auths == [None]
    credentials.candidates(parse_image(ECR_IMAGE), [])

    assert [(registry.account, host) for registry, host in tokens.asked] == [("123456789012", ECR_HOST)]


def test_a_token_that_cannot_be_had_is_named_and_the_pull_goes_anonymous() -> None:
    tokens = FakeTokens(RegistryTokenError(ECR_HOST, "ecr:GetAuthorizationToken: AccessDeniedException: no"))
    credentials = RegistryCredentials(secrets=FakeSecrets({}), tokens=tokens)

    found = credentials.candidates(parse_image(ECR_IMAGE), [])

    assert found.auths == [None]
    reason = "ecr:GetAuthorizationToken: AccessDeniedException: no"
    assert found.problems == [f"cannot get a token for {ECR_HOST}: {reason}"]


class CountingSource:
    def __init__(self, clock: list[float], lifetime: float) -> None:
        self.clock = clock
        self.lifetime = lifetime
        self.calls: list[RegistryConfig] = []

    def token(self, registry: RegistryConfig) -> RegistryToken:
        self.calls.append(registry)
        now = self.clock[0]
        return RegistryToken.for_hosts("AWS", f"token-{len(self.calls)}", registry.hosts, issued_at=now,
                                       expires_at=now + self.lifetime)


@pytest.fixture
def ecr() -> EcrRegistry:
    registry = parse_ecr_registry(ECR_HOST)
    assert registry is not None
    return registry


def test_ecr_tokens_are_cached_until_half_their_lifetime(ecr: EcrRegistry) -> None:
    now = [1000.0]
    source = CountingSource(now, lifetime=12 * 3600)
    tokens = EcrTokens(clock=lambda: now[0], source=source)

    first = tokens.auth(ecr, ECR_HOST)
    now[0] += 6 * 3600 - 1
    cached = tokens.auth(ecr, f"{ECR_HOST}:443")
    now[0] += 1
    renewed = tokens.auth(ecr, ECR_HOST)

    assert (first.password, cached.password, renewed.password) == ("token-1", "token-1", "token-2")
    assert cached.server == f"{ECR_HOST}:443"
    assert (source.calls[0].account, source.calls[0].region) == ("123456789012", "us-west-2")


def test_an_already_expired_token_is_not_cached(ecr: EcrRegistry) -> None:
    now = [1000.0]
    source = CountingSource(now, lifetime=-1)
    tokens = EcrTokens(clock=lambda: now[0], source=source)

    tokens.auth(ecr, ECR_HOST)
    tokens.auth(ecr, ECR_HOST)

    assert len(source.calls) == 2


def test_ecr_public_asks_for_the_public_registrys_token() -> None:
    now = [0.0]
    source = CountingSource(now, lifetime=3600)
    tokens = EcrTokens(clock=lambda: now[0], source=source)
    public = parse_ecr_registry("public.ecr.aws")
    assert public is not None

    tokens.auth(public, "public.ecr.aws")

    assert source.calls[0].public


# --- the refresher's registry copies ------------------------------------------------------------------

PREFIX = "prewarm/prod"
COPY_NAME = f"{PREFIX}/registry/{ECR_HOST}"
ACCESS_DENIED = RegistryTokenError(
    ECR_HOST, "ecr:GetAuthorizationToken: AccessDeniedException: User is not authorized to perform: "
    "ecr:GetAuthorizationToken"
)


class FakeCopies:
    """The refresher's copies by host: a keyring, an error (expired, unreadable), or absent."""

    def __init__(self, copies: dict[str, Keyring | Exception]) -> None:
        self.copies = copies
        self.read: list[tuple[str, str]] = []

    def registry_copy(self, prefix: str, host: str) -> RegistryCopy | None:
        self.read.append((prefix, host))
        found = self.copies.get(host)
        if isinstance(found, Exception):
            raise found
        return None if found is None else RegistryCopy(registry_secret_name(prefix, host), found, None, None)


def copy_of(host: str, password: str = "copied-token") -> Keyring:
    return keyring({host: ("AWS", password)})


def test_the_copy_is_not_read_while_the_role_gets_tokens() -> None:
    # Given an agent whose role gets ECR tokens, with copies configured
    copies = FakeCopies({ECR_HOST: copy_of(ECR_HOST)})
    credentials = RegistryCredentials(secrets=FakeSecrets({}), tokens=FakeTokens(),
                                      copies=RegistryCopies(copies, PREFIX))

    # When an ECR image's credentials are gathered
    found = credentials.candidates(parse_image(ECR_IMAGE), [])

    # Then the role's token is the node's credential and no copy was read
    assert [a.password for a in found.auths if a] == ["ecr-token"]
    assert copies.read == []
    assert found.problems == []


def test_when_ecr_refuses_the_role_the_copy_is_tried_after_the_pull_secrets() -> None:
    # Given a role ECR refuses, a pull secret for the image and the refresher's copy of the registry
    tokens = FakeTokens(ACCESS_DENIED)
    copies = FakeCopies({ECR_HOST: copy_of(ECR_HOST)})
    secrets = FakeSecrets({"arn:ci": keyring({f"{ECR_HOST}/team": ("ci", "pw")})})
    credentials = RegistryCredentials(secrets=secrets, tokens=tokens, copies=RegistryCopies(copies, PREFIX))

    # When an ECR image's credentials are gathered
    found = credentials.candidates(parse_image(ECR_IMAGE), ["arn:ci"])

    # Then the pull secret comes first, then the copy; the copy served, so the refusal is no problem
    assert [(a.username, a.password, a.server) for a in found.auths if a] == [
        ("ci", "pw", f"{ECR_HOST}/team"), ("AWS", "copied-token", ECR_HOST)
    ]
    assert len(tokens.asked) == 1
    assert copies.read == [(PREFIX, ECR_HOST)]
    assert found.problems == []


def test_with_copies_only_the_role_is_never_asked() -> None:
    copies = FakeCopies({ECR_HOST: copy_of(ECR_HOST)})
    credentials = RegistryCredentials(secrets=FakeSecrets({}), tokens=None, copies=RegistryCopies(copies, PREFIX))

    found = credentials.candidates(parse_image(ECR_IMAGE), [])

    assert [a.password for a in found.auths if a] == ["copied-token"]
    assert found.problems == []


def test_the_copy_serves_the_images_host_with_its_port() -> None:
    copies = FakeCopies({ECR_HOST: copy_of(ECR_HOST)})
    credentials = RegistryCredentials(secrets=FakeSecrets({}), tokens=None, copies=RegistryCopies(copies, PREFIX))

    found = credentials.candidates(parse_image(f"{ECR_HOST}:443/team/api:v1"), [])

    assert [(a.password, a.server) for a in found.auths if a] == [("copied-token", f"{ECR_HOST}:443")]
    assert copies.read == [(PREFIX, ECR_HOST)]


def test_a_missing_copy_is_named_with_its_secret_and_the_pull_goes_anonymous() -> None:
    credentials = RegistryCredentials(secrets=FakeSecrets({}), tokens=FakeTokens(ACCESS_DENIED),
                                      copies=RegistryCopies(FakeCopies({}), PREFIX))

    found = credentials.candidates(parse_image(ECR_IMAGE), [])

    assert found.auths == [None]
    assert found.problems[0] == str(ACCESS_DENIED)
    assert found.problems[1].startswith(f"no registry copy for {ECR_HOST}: secret {COPY_NAME} does not exist")


def test_an_expired_copy_is_named_and_its_value_is_not() -> None:
    expired = AgentCredentialsError(
        f"secret {COPY_NAME} expired at 2015-01-01T00:00:00Z; check that refresh_ecr_credentials runs"
    )
    credentials = RegistryCredentials(secrets=FakeSecrets({}), tokens=None,
                                      copies=RegistryCopies(FakeCopies({ECR_HOST: expired}), PREFIX))

    found = credentials.candidates(parse_image(ECR_IMAGE), [])

    assert found.auths == [None]
    assert found.problems == [str(expired)]


def test_a_copy_without_the_registrys_host_is_refused_by_name(ecr: EcrRegistry) -> None:
    copies = FakeCopies({ECR_HOST: copy_of("registry.example.com", "other-secret")})

    with pytest.raises(RegistryCopyError) as caught:
        RegistryCopies(copies, PREFIX).auth(ecr, ECR_HOST)

    assert str(caught.value) == f"registry copy {COPY_NAME} holds no credentials for {ECR_HOST}"
    assert "other-secret" not in str(caught.value)


def test_ecr_public_images_use_the_public_registrys_copy() -> None:
    copies = FakeCopies({"public.ecr.aws": copy_of("public.ecr.aws", "public-token")})
    credentials = RegistryCredentials(secrets=FakeSecrets({}), tokens=None, copies=RegistryCopies(copies, PREFIX))

    found = credentials.candidates(parse_image("public.ecr.aws/team/tool:v1"), [])

    assert [a.password for a in found.auths if a] == ["public-token"]


def test_no_copy_is_read_for_registries_that_are_not_ecr() -> None:
    copies = FakeCopies({})
    credentials = RegistryCredentials(secrets=FakeSecrets({}), tokens=None, copies=RegistryCopies(copies, PREFIX))

    assert credentials.candidates(parse_image("quay.io/team/app:v1"), []).auths == [None]
    assert copies.read == []


class FakeAgentSecrets(FakeSecrets, FakeCopies):
    def __init__(self, copies: dict[str, Keyring | Exception]) -> None:
        FakeSecrets.__init__(self, {})
        FakeCopies.__init__(self, copies)


class RefusingSource:
    def __init__(self) -> None:
        self.calls = 0

    def token(self, registry: RegistryConfig) -> RegistryToken:
        self.calls += 1
        raise ACCESS_DENIED


SETTINGS = {
    "NODE_NAME": "ip-10-0-1-5.ec2.internal",
    "NODE_QUEUE_PREFIX": "prewarm-node",
    "STATUS_QUEUE_URL": "https://sqs.us-west-2.amazonaws.com/123456789012/prewarm-status",
    "AWS_REGION": "us-west-2",
}


@pytest.mark.parametrize(
    ("env", "role_asked", "copy_read"),
    [
        ({}, 1, False),
        ({"SECRET_PREFIX": PREFIX}, 0, True),
        ({"SECRET_PREFIX": PREFIX, "ECR_CREDENTIALS": "shared"}, 0, True),
        ({"SECRET_PREFIX": PREFIX, "ECR_CREDENTIALS": "role"}, 1, True),
        ({"SECRET_PREFIX": PREFIX, "ECR_CREDENTIALS": "copies"}, 0, True),
    ],
)
def test_the_settings_choose_the_role_the_copies_or_both(env: dict[str, str], role_asked: int,
                                                         copy_read: bool) -> None:
    # Given an agent configured by its environment, whose role ECR refuses (shared, the default, reads
    # the copy first and so never asks the role while the copy serves)
    settings = AgentSettings.from_env({**SETTINGS, **env})
    source = RefusingSource()
    secrets = FakeAgentSecrets({ECR_HOST: copy_of(ECR_HOST)})
    credentials = registry_credentials(settings, secrets=secrets, clock=lambda: 0.0, token_source=source)

    # When an ECR image's credentials are gathered
    found = credentials.candidates(parse_image(ECR_IMAGE), [])

    # Then the role is asked and the copy read exactly as configured
    assert source.calls == role_asked
    assert bool(secrets.read) is copy_read
    assert [a.password for a in found.auths if a] == (["copied-token"] if copy_read else [])
