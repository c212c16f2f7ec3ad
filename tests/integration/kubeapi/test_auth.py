"""Authentication: tokens map to identities (static tokens, EKS tokens through access entries), 401
for any other token, impersonation, as the official client sees them."""

# mypy: disable-error-code="union-attr, arg-type, misc, index, no-untyped-call"

from __future__ import annotations

import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from typing import Any

import boto3
import pytest
from kubernetes.client import ApiClient, ApiException, AuthorizationV1Api, CoreV1Api, V1SelfSubjectAccessReview

from prewarm.adapters.eks_auth import EksTokenSource
from prewarm_devtools.kubeapi import DEFAULT_CLUSTER_CREATOR, AccessEntry, Identity, KubeApiServer, service_account
from tests.support.kube import call, status_of

pytestmark = pytest.mark.integration

ROLE = "arn:aws:iam::111122223333:role/prewarm-dispatch"
SESSION = "arn:aws:sts::111122223333:assumed-role/prewarm-dispatch/fn"


def eks_token(access_key: str) -> str:
    """An EKS token signed as `aws eks get-token` signs it, with `access_key`."""
    session = boto3.Session(aws_access_key_id=access_key, aws_secret_access_key="secret", region_name="us-west-2")
    token: str = EksTokenSource("prewarm-local", session)()
    return token


def who_am_i(api: KubeApiServer, token: str) -> str:
    """The user the server sees for `token`, as a denied list of nodes names it."""
    with api.api_client(token) as client, pytest.raises(ApiException) as raised:
        CoreV1Api(client).list_node()
    message: str = status_of(raised.value)["message"]
    return message.split('User "')[1].split('"')[0]


@pytest.fixture
def api() -> Iterator[KubeApiServer]:
    with KubeApiServer() as server:
        yield server


def test_the_admin_token_is_in_system_masters(api: KubeApiServer) -> None:
    # Given the server's own token, When it asks whether it may do anything at all
    with api.api_client() as client:
        review = AuthorizationV1Api(client).create_self_subject_access_review(
            V1SelfSubjectAccessReview(spec={"resourceAttributes": {"verb": "*", "group": "*", "resource": "*"}})
        )
    # Then it may (system:masters bypasses RBAC, with no reason given)
    assert review.status.allowed is True and review.status.reason is None


def test_a_configured_token_is_its_identity_and_nothing_more() -> None:
    # Given a token for alice, in group dev, with no RBAC for either
    with (
        KubeApiServer(identities={"alice-token": Identity("alice", ("dev",))}) as api,
        api.api_client("alice-token") as client,
        pytest.raises(ApiException) as raised,
    ):
        # When alice lists pods, Then she is refused as alice
        CoreV1Api(client).list_namespaced_pod("default")
    assert raised.value.status == 403
    assert status_of(raised.value)["message"] == (
        'pods is forbidden: User "alice" cannot list resource "pods" in API group "" in the namespace "default"'
    )


def test_identities_added_and_removed_at_runtime(api: KubeApiServer) -> None:
    # Given a token unknown to the running server
    with api.api_client("late-token") as client:
        assert call(client, "GET", "/version").status == 401
        # When it is added as a service account, Then requests with it are that account
        api.add_identity("late-token", service_account("prewarm", "dispatch"))
        answer = call(client, "GET", "/api/v1/nodes")
        assert (answer.status, answer.body["message"]) == (
            403,
            'nodes is forbidden: User "system:serviceaccount:prewarm:dispatch" cannot list resource "nodes" '
            'in API group "" at the cluster scope',
        )
        # And when it is removed, Then it is 401 again
        api.remove_identity("late-token")
        assert call(client, "GET", "/version").status == 401


@pytest.mark.parametrize(
    "token",
    [
        "not-configured",
        "k8s-aws-v1.aHR0cHM6Ly9zdHMuYW1hem9uYXdzLmNvbS8",  # https://sts.amazonaws.com/ and nothing signed
        "k8s-aws-v1.!!!",
    ],
)
def test_unknown_or_malformed_tokens_are_401_as_the_api_server_words_it(api: KubeApiServer, token: str) -> None:
    with api.api_client(token) as client, pytest.raises(ApiException) as raised:
        CoreV1Api(client).list_namespace()
    assert raised.value.status == 401
    assert status_of(raised.value) == {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": "Unauthorized",
        "reason": "Unauthorized",
        "code": 401,
    }


def test_an_eks_token_of_an_unmapped_key_is_the_cluster_creator_who_is_admin(api: KubeApiServer) -> None:
    # Given any local AWS credential (moto knows them all as one user, the cluster's creator)
    token = eks_token("AKIALOCAL")
    # When it lists namespaces, Then it may: EKS gives the creator an admin access entry
    with api.api_client(token) as client:
        assert len(CoreV1Api(client).list_namespace().items) == 4


def test_an_eks_token_maps_through_the_access_entry_of_its_role() -> None:
    # Given an access key of the dispatch role, whose access entry names a user and a group
    with KubeApiServer(
        aws_principals={"AKIADISPATCH": SESSION},
        access_entries={ROLE: AccessEntry(groups=("prewarm:dispatch",))},
        default_aws_principal=None,
    ) as api:
        # When its EKS token lists nodes, Then the request is the role's session, refused by RBAC
        assert who_am_i(api, eks_token("AKIADISPATCH")) == SESSION
        # And with an entry that names the user, that name is used
        api.add_access_entry(
            ROLE, AccessEntry(username="prewarm-dispatch:{{SessionName}}", groups=("prewarm:dispatch",))
        )
        assert who_am_i(api, eks_token("AKIADISPATCH")) == "prewarm-dispatch:fn"
        # And a key of no known principal, or of a principal without an access entry, is 401
        with api.api_client(eks_token("AKIAOTHER")) as client:
            assert call(client, "GET", "/version").status == 401
        api.remove_access_entry(ROLE)
        with api.api_client(eks_token("AKIADISPATCH")) as client:
            assert call(client, "GET", "/version").status == 401


def test_the_creator_has_no_access_without_its_entry() -> None:
    # Given access entries that leave out the cluster creator
    with KubeApiServer(access_entries={}) as api, api.api_client(eks_token("AKIALOCAL")) as client:
        # Then its tokens are refused
        assert call(client, "GET", "/api/v1/namespaces").status == 401
        # Until it gets an entry at runtime
        api.add_access_entry(DEFAULT_CLUSTER_CREATOR, AccessEntry(groups=("system:masters",)))
        assert call(client, "GET", "/api/v1/namespaces").status == 200


def test_an_eks_token_older_than_15_minutes_is_401() -> None:
    # Given a token signed now, and a server whose clock is 16 minutes ahead
    token = eks_token("AKIALOCAL")
    with KubeApiServer(clock=lambda: time.time() + 16 * 60) as api, api.api_client(token) as client:
        # When it is used, Then it is refused
        assert call(client, "GET", "/api/v1/namespaces").status == 401


def test_impersonation_needs_the_impersonate_verb(api: KubeApiServer) -> None:
    api.add_identity("bob-token", Identity("bob"))
    # Given the admin impersonating alice, Then the request is alice's (and refused as hers)
    with api.api_client() as client:
        client.set_default_header("Impersonate-User", "alice")
        answer = call(client, "GET", "/api/v1/namespaces/default/secrets")
    assert (answer.status, answer.body["message"]) == (
        403,
        'secrets is forbidden: User "alice" cannot list resource "secrets" in API group "" in the namespace "default"',
    )
    # Given bob, who may not impersonate, When he tries, Then the impersonation itself is refused
    with api.api_client("bob-token") as client:
        client.set_default_header("Impersonate-User", "alice")
        answer = call(client, "GET", "/api/v1/namespaces/default/secrets")
    assert (answer.status, answer.body["message"], answer.body["details"]) == (
        403,
        'users "alice" is forbidden: User "bob" cannot impersonate resource "users" in API group "" '
        "at the cluster scope",
        {"name": "alice", "kind": "users"},
    )


def test_a_self_subject_review_says_who_the_caller_is_as_kubectl_auth_whoami_asks(api: KubeApiServer) -> None:
    api.add_identity("agent-token", service_account("prewarm-system", "prewarm-agent", node="n1"))
    api.add_identity("carol-token", Identity("carol", ("dev",)))

    def whoami(token: str, *, impersonate: str = "") -> tuple[int, Any]:
        with api.api_client(token) as client:
            if impersonate:
                client.set_default_header("Impersonate-User", impersonate)
            answer = call(client, "POST", "/apis/authentication.k8s.io/v1/selfsubjectreviews", body={})
        return answer.status, answer.body

    # The admin, a node-bound service account token (with its extra), a user RBAC grants nothing,
    # and the admin impersonating alice: each is told its own user, as authentication made it
    admin, agent, carol, alice = whoami(api.token), whoami("agent-token"), whoami("carol-token"), \
        whoami(api.token, impersonate="alice")
    assert admin[0] == 201 and admin[1]["kind"] == "SelfSubjectReview"
    assert admin[1]["apiVersion"] == "authentication.k8s.io/v1"
    assert admin[1]["status"]["userInfo"] == {"username": "kubernetes-admin",
                                              "groups": ["system:masters", "system:authenticated"]}
    assert agent[1]["status"]["userInfo"] == {
        "username": "system:serviceaccount:prewarm-system:prewarm-agent",
        "groups": ["system:serviceaccounts", "system:serviceaccounts:prewarm-system", "system:authenticated"],
        "extra": {"authentication.kubernetes.io/node-name": ["n1"]}}
    assert carol[0] == 201 and carol[1]["status"]["userInfo"]["username"] == "carol"
    assert alice[1]["status"]["userInfo"] == {"username": "alice", "groups": ["system:authenticated"]}
    # A review is not stored: there is nothing to read back
    with api.api_client() as client:
        assert call(client, "GET", "/apis/authentication.k8s.io/v1/selfsubjectreviews").status == 405


def test_the_plugin_makes_clients_for_any_identity(kube_client_as: Callable[[Identity], ApiClient]) -> None:
    # Given a client acting as a service account with no RBAC
    client = kube_client_as(service_account("prewarm", "record-status"))
    # When it reads a node, Then it is refused as that account
    answer = call(client, "GET", "/api/v1/nodes/n1")
    assert (answer.status, answer.body["message"]) == (
        403,
        'nodes "n1" is forbidden: User "system:serviceaccount:prewarm:record-status" cannot get resource "nodes" '
        'in API group "" at the cluster scope',
    )


def local_token(cluster: str, secret: str = "local") -> str:
    """An EKS token for `cluster`, signed as local principals sign (secret key `local`)."""
    session = boto3.Session(aws_access_key_id="AKIALOCAL", aws_secret_access_key=secret, region_name="us-west-2")
    token: str = EksTokenSource(cluster, session)()
    return token


def test_a_cluster_refuses_an_eks_token_made_for_another_cluster() -> None:
    # Given the API of cluster "blue", which checks what a token was signed for, as EKS does through STS
    with KubeApiServer(cluster_name="blue") as api:
        # When a token made for "blue" is used, Then it is the creator's, an admin
        with api.api_client(local_token("blue")) as client:
            assert call(client, "GET", "/api/v1/namespaces").status == 200
        # When the same principal's token for "green" is used, Then it is refused: its signed
        # x-k8s-aws-id header names "green"
        with api.api_client(local_token("green")) as client:
            assert call(client, "GET", "/api/v1/namespaces").status == 401
        # And a token for "blue" signed with another secret key fails the signature check too
        with api.api_client(local_token("blue", secret="forged")) as client:
            assert call(client, "GET", "/api/v1/namespaces").status == 401


@pytest.fixture
def command_line_server() -> Iterator[Callable[[str], int]]:
    """`python -m prewarm_devtools.kubeapi --cluster-name blue`, and what its namespaces answer a token."""
    server = subprocess.Popen([sys.executable, "-m", "prewarm_devtools.kubeapi", "--cluster-name", "blue"],
                              stdout=subprocess.PIPE, text=True)
    try:
        assert server.stdout is not None
        started = next((line for line in server.stdout if line.startswith("Kubernetes API:")), "")
        assert started, "the server did not start"
        url = started.split(":", 1)[1].strip()

        def answer(token: str) -> int:
            request = urllib.request.Request(f"{url}/api/v1/namespaces", headers={"Authorization": f"Bearer {token}"})
            try:
                with urllib.request.urlopen(request, timeout=10) as response:
                    return int(response.status)
            except urllib.error.HTTPError as error:
                return error.code

        yield answer
    finally:
        server.send_signal(signal.SIGTERM)
        server.wait(timeout=10)


def test_the_command_line_server_takes_only_eks_tokens_signed_for_its_cluster(
    command_line_server: Callable[[str], int],
) -> None:
    # A token made for its cluster is the creator's, an admin
    assert command_line_server(local_token("blue")) == 200
    # One made for another cluster, or signed with another key (forged), is refused as EKS refuses it
    assert command_line_server(local_token("green")) == 401
    assert command_line_server(local_token("blue", secret="forged")) == 401
