"""ECR and ECR Public tokens, with assumed roles for cross-account registries (moto, Stubber)."""

from __future__ import annotations

import base64
import datetime
from typing import Any

import boto3
import pytest
from botocore.stub import Stubber

from prewarm.adapters.ecr_auth import EcrTokenSource, RoleCredentials, boto3_client
from prewarm.domain.refresh import RegistryConfig
from prewarm.services.ports import RegistryTokenError
from tests.support.clock import HOUR, Clock

ROLE = "arn:aws:iam::444455556666:role/prewarm-ecr-pull"
# moto's ECR token is fixed and already expired: it expires at 2015-01-01T00:00:00Z. The clock is put
# 12 hours before that, so the token looks as it would coming from ECR.
MOTO_EXPIRY = datetime.datetime(2015, 1, 1, tzinfo=datetime.UTC).timestamp()
MOTO_ISSUE = MOTO_EXPIRY - 12 * HOUR


def registry(**fields: Any) -> RegistryConfig:
    return RegistryConfig.model_validate(fields)


class RecordingFactory:
    """boto3 clients as `EcrTokenSource` asks for them, recording each request."""

    def __init__(self) -> None:
        self.made: list[tuple[str, str, str | None]] = []

    def __call__(self, service: str, region: str, credentials: RoleCredentials | None) -> Any:
        self.made.append((service, region, credentials.access_key_id if credentials else None))
        return boto3_client(service, region, credentials)


@pytest.mark.usefixtures("aws")
def test_private_registry_token_is_decoded_for_every_host_with_ecr_expiry() -> None:
    source = EcrTokenSource(clock=Clock(MOTO_ISSUE))
    token = source.token(registry(account="111122223333", region="eu-west-1", extraHosts=["cache.example.com"]))
    assert token.hosts == ("111122223333.dkr.ecr.eu-west-1.amazonaws.com", "cache.example.com")
    assert {(a.username, a.password) for a in token.auths} == {("AWS", "111122223333-auth-token")}
    assert (token.issued_at, token.expires_at) == (MOTO_ISSUE, MOTO_EXPIRY)


@pytest.mark.usefixtures("aws")
def test_cross_account_registry_assumes_the_role_once_per_session() -> None:
    factory = RecordingFactory()
    clock = Clock(MOTO_ISSUE)
    source = EcrTokenSource(factory, clock)
    target = registry(account="444455556666", region="us-west-2", roleArn=ROLE)
    # When two tokens are asked for
    source.token(target)
    source.token(target)
    # Then STS was called once, in the registry's region, and ECR twice as the assumed role
    sts = [m for m in factory.made if m[0] == "sts"]
    ecr = [m for m in factory.made if m[0] == "ecr"]
    assert sts == [("sts", "us-west-2", None)]
    assert len(ecr) == 2 and all(m[1] == "us-west-2" and m[2] and m[2].startswith("ASIA") for m in ecr)


@pytest.mark.usefixtures("aws")
def test_assumed_session_is_replaced_before_it_expires() -> None:
    factory = RecordingFactory()
    clock = Clock(MOTO_ISSUE)
    source = EcrTokenSource(factory, clock)
    first = source.role_credentials(ROLE, "us-east-1", "h")
    clock.now = first.expires_at - 60  # inside the renewal margin
    second = source.role_credentials(ROLE, "us-east-1", "h")
    assert second is not first
    assert [m[0] for m in factory.made] == ["sts", "sts"]


def test_role_credentials_repr_hides_the_secret() -> None:
    credentials = RoleCredentials("ASIAEXAMPLE", "wJalrXUtnFEMI", "FwoGZXIvYXdzEBY", 1.0)
    assert "wJalrXUtnFEMI" not in repr(credentials) and "FwoGZXIvYXdzEBY" not in repr(credentials)


def stubbed_public(answer: dict[str, Any] | None = None, error: str | None = None) -> tuple[Any, Stubber]:
    client = boto3.client("ecr-public", region_name="us-east-1", aws_access_key_id="x", aws_secret_access_key="x")
    stubber = Stubber(client)
    if error:
        stubber.add_client_error("get_authorization_token", service_error_code=error, service_message="denied")
    else:
        stubber.add_response("get_authorization_token", answer or {}, {})
    stubber.activate()
    return client, stubber


def test_public_registry_token_comes_from_ecr_public_in_us_east_1() -> None:
    # moto does not implement ecr-public:GetAuthorizationToken; the answer is stubbed as AWS documents it.
    expires = datetime.datetime(2026, 1, 1, 12, tzinfo=datetime.UTC)
    encoded = base64.b64encode(b"AWS:public-password").decode()
    client, stubber = stubbed_public({"authorizationData": {"authorizationToken": encoded, "expiresAt": expires}})
    asked: list[tuple[str, str]] = []

    def factory(service: str, region: str, credentials: RoleCredentials | None) -> Any:
        asked.append((service, region))
        return client

    token = EcrTokenSource(factory, Clock(expires.timestamp() - 12 * HOUR)).token(registry(public=True))
    stubber.assert_no_pending_responses()
    assert asked == [("ecr-public", "us-east-1")]
    assert token.hosts == ("public.ecr.aws",) and token.auths[0].password == "public-password"
    assert token.expires_at == expires.timestamp()


def test_aws_refusal_names_the_registry_and_the_call() -> None:
    client, _ = stubbed_public(error="AccessDeniedException")
    source = EcrTokenSource(lambda *_: client)
    with pytest.raises(RegistryTokenError) as raised:
        source.token(registry(public=True))
    assert str(raised.value) == (
        "cannot get a token for public.ecr.aws: ecr-public:GetAuthorizationToken: AccessDeniedException: denied"
    )


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({}, "answered no authorizationToken or expiresAt"),
        ({"authorizationToken": base64.b64encode(b"no-colon").decode(),
          "expiresAt": datetime.datetime(2026, 1, 1, tzinfo=datetime.UTC)}, 'must decode to "username:password"'),
    ],
)
def test_malformed_answers_are_errors_without_the_token(data: dict[str, Any], message: str) -> None:
    client, _ = stubbed_public({"authorizationData": data})
    with pytest.raises(RegistryTokenError, match=message) as raised:
        EcrTokenSource(lambda *_: client).token(registry(public=True))
    assert "no-colon" not in str(raised.value)
