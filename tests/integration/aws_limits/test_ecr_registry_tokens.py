"""The registry that plays ECR admits what ECR admits: only tokens GetAuthorizationToken issued, each
carrying the permissions of the principal that asked for it. A pull's manifest needs ecr:BatchGetImage
and its blobs ecr:GetDownloadUrlForLayer on the repository; anything else is ECR's 403, in IAM's words.
Through the same door, containerd pulls with real credentials."""

from __future__ import annotations

import base64
import http.client
import json
import time
from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import boto3
import pytest

from prewarm.domain.registry_budget import is_throttled
from prewarm_agent.attempts import is_auth_error
from prewarm_agent.cri.errors import ImagePullError
from prewarm_devtools.aws_limits.ecr import registry_request
from prewarm_devtools.localecr import ecr_host
from prewarm_devtools.node.containerd import PrivateContainerd
from prewarm_devtools.node.images import PushedImage, RegistryPusher, build_image
from prewarm_devtools.node.registry import LocalRegistry
from prewarm_devtools.pytest_plugins.node import node_tools_missing
from prewarm_devtools.sam.aws import ACCOUNT, REGION, LocalIdentity, MotoServer

pytestmark = [pytest.mark.integration, pytest.mark.node]

REPOSITORIES = f"arn:aws:ecr:{REGION}:{ACCOUNT}:repository"
TOKEN = {"Effect": "Allow", "Action": "ecr:GetAuthorizationToken", "Resource": "*"}


@pytest.fixture(scope="module")
def aws() -> Iterator[MotoServer]:
    with MotoServer(limits=True) as server:
        assert server.layer is not None
        server.layer.ecr.issues_tokens = True
        try:
            yield server
        finally:
            server.layer.ecr.issues_tokens = False


def role(name: str, *statements: dict[str, Any]) -> LocalIdentity:
    identity = LocalIdentity.of_role(f"arn:aws:iam::{ACCOUNT}:role/registry-{name}")
    identity.register([{"Version": "2012-10-17", "Statement": [TOKEN, *statements]}])
    return identity


def token_of(aws: MotoServer, identity: LocalIdentity | None) -> tuple[str, str]:
    keys = {} if identity is None else {"aws_access_key_id": identity.access_key_id,
                                         "aws_secret_access_key": identity.secret_access_key}
    ecr = boto3.client("ecr", region_name=REGION, endpoint_url=aws.url, **keys) if keys else aws.client("ecr")
    encoded = ecr.get_authorization_token()["authorizationData"][0]["authorizationToken"]
    user, _, password = base64.b64decode(encoded).decode().partition(":")
    return user, password


@pytest.fixture(scope="module")
def registry(aws: MotoServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalRegistry]:
    if reason := node_tools_missing():
        pytest.skip(reason)
    assert aws.layer is not None
    door = aws.layer.ecr.registry_refusal

    def check(authorization: str | None, method: str, path: str) -> Any:
        return door(authorization, method, path, account=ACCOUNT, region=REGION)

    with LocalRegistry(tmp_path_factory.mktemp("ecr"), door=check, client_auth=token_of(aws, None),
                       realm=ecr_host()) as served:
        yield served


@pytest.fixture(scope="module")
def image(registry: LocalRegistry) -> PushedImage:
    return RegistryPusher(registry.url, registry.auth).push_image("team-a/app", "v1", build_image(size_mb=0.1))


@pytest.fixture(scope="module")
def containerd(registry: LocalRegistry, tmp_path_factory: pytest.TempPathFactory) -> Iterator[PrivateContainerd]:
    instance = PrivateContainerd(tmp_path_factory.mktemp("ctd"))
    instance.add_registry_mirror(ecr_host(), registry.url)
    instance.start()
    try:
        yield instance
    finally:
        instance.stop()
        instance.remove_data()


def fetch(registry: LocalRegistry, method: str, path: str, auth: tuple[str, str] | None) -> tuple[int, Any, str]:
    connection = http.client.HTTPConnection("127.0.0.1", registry.port, timeout=10)
    headers = {"Accept": "application/vnd.oci.image.manifest.v1+json"}
    if auth is not None:
        headers["Authorization"] = "Basic " + base64.b64encode(":".join(auth).encode()).decode()
    try:
        connection.request(method, path, headers=headers)
        response = connection.getresponse()
        body = response.read()
        return response.status, json.loads(body) if body.startswith(b"{") else body, \
            response.getheader("WWW-Authenticate") or ""
    finally:
        connection.close()


def denied(identity: LocalIdentity, action: str, repository: str) -> dict[str, Any]:
    return {"errors": [{"code": "DENIED", "message": (
        f"User: {identity.arn} is not authorized to perform: {action} on resource: {REPOSITORIES}/{repository} "
        f"because no identity-based policy allows the {action} action")}]}


def test_a_pull_needs_batch_get_image_for_the_manifest_and_get_download_url_for_layer_for_blobs(
    aws: MotoServer, registry: LocalRegistry, image: PushedImage
) -> None:
    manifests_only = role("manifests", {"Effect": "Allow", "Action": "ecr:BatchGetImage",
                                        "Resource": f"{REPOSITORIES}/*"})
    token_only = role("token-only")
    blob = f"/v2/team-a/app/blobs/{image.layer_digests[0]}"

    # Given a token of a role that may get images but not layers, and one of a role that may do neither
    with_manifests, bare = token_of(aws, manifests_only), token_of(aws, token_only)

    # Then the manifest is served to the first, its blobs are not, and the second gets neither, in ECR's words
    assert fetch(registry, "GET", "/v2/team-a/app/manifests/v1", with_manifests)[0] == 200
    assert fetch(registry, "GET", blob, with_manifests)[:2] == (
        403, denied(manifests_only, "ecr:GetDownloadUrlForLayer", "team-a/app"))
    assert fetch(registry, "GET", "/v2/team-a/app/manifests/v1", bare)[:2] == (
        403, denied(token_only, "ecr:BatchGetImage", "team-a/app"))
    assert fetch(registry, "HEAD", "/v2/team-a/app/manifests/v1", bare)[0] == 403
    # /v2/ needs only a valid token
    assert fetch(registry, "GET", "/v2/", bare)[0] == 200


def test_only_tokens_it_issued_are_admitted_and_an_expired_one_is_refused_as_ecr_does(
    aws: MotoServer, registry: LocalRegistry, image: PushedImage
) -> None:
    assert aws.layer is not None
    path = "/v2/team-a/app/manifests/v1"
    status, body, challenge = fetch(registry, "GET", path, None)
    assert (status, body) == (401, {"errors": [{"code": "DENIED", "message": "Not Authorized"}]})
    assert challenge == f'Basic realm="https://{ecr_host()}/",service="ecr.amazonaws.com"'
    # moto's own fixed token, and a made-up one, open nothing
    assert fetch(registry, "GET", path, ("AWS", f"{ACCOUNT}-auth-token"))[0] == 401
    assert fetch(registry, "GET", path, ("AWS", "made-up"))[0] == 401

    aws.layer.ecr.token_lifetime_s = 12 * 3600
    try:
        user, password = token_of(aws, None)
        aws.layer.ecr.wall_clock = lambda: time.time() + 12 * 3600 + 1
        assert fetch(registry, "GET", path, (user, password))[:2] == (403, {"errors": [{
            "code": "DENIED", "message": "Your authorization token has expired. Reauthenticate and try again."}]})
    finally:
        aws.layer.ecr.token_lifetime_s = None
        aws.layer.ecr.wall_clock = time.time


def test_containerd_pulls_with_a_token_whose_principal_may_pull_and_gets_403_with_one_that_may_not(
    aws: MotoServer, registry: LocalRegistry, image: PushedImage, containerd: PrivateContainerd
) -> None:
    puller = role("puller", {"Effect": "Allow", "Action": ["ecr:BatchGetImage", "ecr:GetDownloadUrlForLayer"],
                             "Resource": f"{REPOSITORIES}/team-a/*"})
    other = role("other-team", {"Effect": "Allow", "Action": ["ecr:BatchGetImage", "ecr:GetDownloadUrlForLayer"],
                                "Resource": f"{REPOSITORIES}/team-b/*"})
    reference = f"{ecr_host()}/team-a/app:v1"

    with containerd.cri_client() as cri:
        with pytest.raises(ImagePullError) as caught:
            cri.pull_image(reference, auth=token_of(aws, other)).result(timeout=30)
        assert "403 Forbidden" in caught.value.details
        assert cri.image_status(reference) is None

        cri.pull_image(reference, auth=token_of(aws, puller)).result(timeout=30)
        assert cri.image_status(reference) is not None
    assert any(status == 403 and b"registry-other-team" in body for _, _, status, body in registry.front.refused)


@pytest.mark.parametrize(("method", "path", "expected"), [
    ("GET", "/v2/", None),
    ("HEAD", "/v2/a/b/manifests/sha256:00", ("ecr:BatchGetImage", "a/b")),
    ("GET", "/v2/a/blobs/sha256:00", ("ecr:GetDownloadUrlForLayer", "a")),
    ("POST", "/v2/a/blobs/uploads/", ("ecr:InitiateLayerUpload", "a")),
    ("PUT", "/v2/a/blobs/uploads/x?digest=sha256:00", ("ecr:CompleteLayerUpload", "a")),
    ("PUT", "/v2/a/manifests/v1", ("ecr:PutImage", "a")),
    ("GET", "/v2/a/tags/list", ("ecr:ListImages", "a")),
])
def test_each_registry_request_is_authorized_as_its_ecr_action(method: str, path: str, expected: Any) -> None:
    assert registry_request(method, path) == expected


def test_a_path_ecr_does_not_serve_is_refused() -> None:
    with pytest.raises(ValueError, match="_catalog"):
        registry_request("GET", "/v2/_catalog")


def assumed(aws: MotoServer, caller: LocalIdentity, role_arn: str) -> LocalIdentity:
    sts = boto3.client("sts", region_name=REGION, endpoint_url=aws.url, aws_access_key_id=caller.access_key_id,
                       aws_secret_access_key=caller.secret_access_key)
    keys = sts.assume_role(RoleArn=role_arn, RoleSessionName="prewarm-refresh")["Credentials"]
    return LocalIdentity(f"{role_arn.replace(':iam:', ':sts:').replace(':role/', ':assumed-role/')}/prewarm-refresh",
                         keys["AccessKeyId"], keys["SecretAccessKey"])


def test_a_token_got_through_assume_role_carries_the_roles_permissions_not_the_callers(
    aws: MotoServer, registry: LocalRegistry, image: PushedImage
) -> None:
    manifest = "/v2/team-a/app/manifests/v1"
    # Given a caller that may assume roles but not pull, a local role that may pull team-a, and a role in
    # IAM (as a registry's `roleArn` names one) that may pull team-b only
    caller = role("assumer", {"Effect": "Allow", "Action": "sts:AssumeRole", "Resource": "*"})
    puller = role("team-a-puller", {"Effect": "Allow", "Action": ["ecr:BatchGetImage", "ecr:GetDownloadUrlForLayer"],
                                    "Resource": f"{REPOSITORIES}/team-a/*"})
    iam = aws.client("iam")
    team_b = iam.create_role(RoleName="registry-team-b", AssumeRolePolicyDocument=json.dumps({
        "Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Principal": {"AWS": "*"},
                                                "Action": "sts:AssumeRole"}]}))["Role"]["Arn"]
    iam.put_role_policy(RoleName="registry-team-b", PolicyName="pull", PolicyDocument=json.dumps({
        "Version": "2012-10-17", "Statement": [TOKEN, {"Effect": "Allow", "Action": "ecr:BatchGetImage",
                                                       "Resource": f"{REPOSITORIES}/team-b/*"}]}))
    # When each role's session asks for a token
    as_puller, as_team_b = assumed(aws, caller, puller.arn), assumed(aws, caller, team_b)
    # Then each token is bound to its session and judged by that role's policies; the caller's own is refused
    assert fetch(registry, "GET", manifest, token_of(aws, as_puller))[0] == 200
    assert fetch(registry, "GET", manifest, token_of(aws, as_team_b))[:2] == (
        403, denied(as_team_b, "ecr:BatchGetImage", "team-a/app"))
    assert fetch(registry, "GET", manifest, token_of(aws, caller))[:2] == (
        403, denied(caller, "ecr:BatchGetImage", "team-a/app"))
    sts = boto3.client("sts", region_name=REGION, endpoint_url=aws.url, aws_access_key_id=as_puller.access_key_id,
                       aws_secret_access_key="x")
    assert sts.get_caller_identity()["Arn"] == as_puller.arn


def test_past_its_layer_quota_the_registry_answers_429_toomanyrequests_and_containerd_s_pull_says_so(
    aws: MotoServer, registry: LocalRegistry, image: PushedImage, containerd: PrivateContainerd
) -> None:
    assert aws.layer is not None
    ecr = aws.layer.ecr
    puller = role("throttled", {"Effect": "Allow", "Action": ["ecr:BatchGetImage", "ecr:GetDownloadUrlForLayer"],
                                "Resource": f"{REPOSITORIES}/team-a/*"})
    token = token_of(aws, puller)
    blob = f"/v2/team-a/app/blobs/{image.layer_digests[0]}"
    before = ecr.quotas
    # Given a layer quota of 3 requests a second (a burst of 3) and a Retry-After of 2 s
    ecr.quotas = replace(before, ecr_layer_per_s=3, ecr_retry_after_s=2)
    try:
        ecr.reset()
        # When blobs are asked for faster than that
        answers = [fetch(registry, "GET", blob, token)[:2] for _ in range(6)]
        # Then the first 3 are served and the next refused with ECR's 429 body (manifests are another quota)
        assert [status for status, _ in answers[:3]] == [200, 200, 200]
        assert answers[3] == (429, {"errors": [{"code": "TOOMANYREQUESTS", "message": "Rate exceeded"}]})
        assert fetch(registry, "GET", "/v2/team-a/app/manifests/v1", token)[0] == 200
        connection = http.client.HTTPConnection("127.0.0.1", registry.port, timeout=10)
        connection.request("GET", blob, headers={"Authorization": "Basic " + base64.b64encode(
            ":".join(token).encode()).decode()})
        response = connection.getresponse()
        assert (response.status, response.getheader("Retry-After")) == (429, "2")
        connection.close()
        assert ecr.throttled["ecr:GetDownloadUrlForLayer"] >= 4

        # And containerd's pull fails with words the agent reads as throttling, not as the node's failure
        ecr.quotas = replace(before, ecr_layer_per_s=0.001)
        ecr.reset()
        ecr.take("ecr:GetDownloadUrlForLayer", ACCOUNT, REGION, 0.001, 1.0)  # the one token spent
        fresh = RegistryPusher(registry.url, registry.auth).push_image("team-a/fresh", "v1", build_image(size_mb=0.1))
        reference = f"{ecr_host()}/team-a/fresh@{fresh.digest}"
        with containerd.cri_client() as cri, pytest.raises(ImagePullError) as caught:
            cri.pull_image(reference, auth=token).result(timeout=30)
        assert is_throttled(caught.value.details) and not is_auth_error(caught.value.details), caught.value.details
    finally:
        ecr.quotas = before
        ecr.reset()


def test_the_registry_s_byte_cap_holds_what_it_serves_to_its_rate(
    aws: MotoServer, registry: LocalRegistry, image: PushedImage
) -> None:
    puller = role("capped", {"Effect": "Allow", "Action": ["ecr:BatchGetImage", "ecr:GetDownloadUrlForLayer"],
                             "Resource": f"{REPOSITORIES}/team-a/*"})
    token = token_of(aws, puller)
    blob = f"/v2/team-a/app/blobs/{image.layer_digests[0]}"
    size = len(fetch(registry, "GET", blob, token)[1])
    # Given a cap of 100 KB a second
    registry.front.bandwidth.set_rate(100_000)
    try:
        # When the blob is fetched three times
        started = time.monotonic()
        assert all(fetch(registry, "GET", blob, token)[0] == 200 for _ in range(3))
        elapsed = time.monotonic() - started
    finally:
        registry.front.bandwidth.set_rate(None)
    # Then what was served came at the cap or slower (the first answer goes at once, the cap paid after it)
    assert size > 50_000 and elapsed >= 0.9 * 2 * size / 100_000
