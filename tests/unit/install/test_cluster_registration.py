"""`prewarm cluster add` refuses, before it changes anything, a stack whose queue names cannot hold a
registered cluster's nodes; it records the cluster before it installs anything, so an agent that starts at
once is served; it installs nothing in a cluster the stack's functions cannot reach or older than Kubernetes
1.30; a refusal or a failed install leaves the cluster recorded Failed with why, and adding it again
finishes the job."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest

from prewarm.adapters.clusters import ServedClusters
from prewarm.domain.clusters import ClusterReach, ClusterSetup, RegisteredCluster
from prewarm.services.ports import ClusterAuthError
from prewarm_cli.clusters import RegistrationError, recorded_health, register_cluster
from tests.support.memory_store import MemoryJobStore


class Untouchable:
    """Any use of the stack, the table or the cluster fails the test: nothing may be done."""

    def __getattr__(self, name: str) -> Any:
        raise AssertionError(f"{name} was used")


class Stack(Untouchable):
    def __init__(self, prefix: str) -> None:
        self.env = {"NODE_QUEUE_PREFIX": prefix}


def test_a_queue_prefix_with_no_room_for_a_registered_clusters_queue_names_is_refused_first() -> None:
    # SQS names hold 80 characters; a registered cluster's queue names take 13 more than the own's
    with pytest.raises(RegistrationError, match=r"prefix '(p{58})' \(58 characters\).*shorter NodeQueuePrefix"):
        register_cluster(Stack("p" * 58), Untouchable(), "prod", {}, [], print, Untouchable(), Untouchable())


def test_a_prefix_that_fits_goes_on_to_eks() -> None:
    with pytest.raises(AssertionError, match="get_cluster was used"):  # the table, read next
        register_cluster(Stack("p" * 57), Untouchable(), "prod", {}, [], print, Untouchable(), Untouchable())


# --- the order: recorded, checked, installed --------------------------------------------------------

ROLE = "arn:aws:iam::123456789012:role/pw-sweep"
DAEMON_SET = {"apiVersion": "apps/v1", "kind": "DaemonSet",
              "metadata": {"name": "prewarm-agent", "namespace": "prewarm-system"}}


class Eks:
    """EKS as `cluster add` uses it: cluster `prod` is ACTIVE with access entries; entries are kept."""

    class exceptions:
        class ResourceInUseException(Exception):
            pass

        class ResourceNotFoundException(Exception):
            pass

    def __init__(self) -> None:
        self.entries: dict[str, list[str]] = {}

    def describe_cluster(self, name: str) -> dict[str, Any]:
        return {"cluster": {"endpoint": "https://prod.example", "certificateAuthority": {"data": "Q0E="},
                            "accessConfig": {"authenticationMode": "API"}}}

    def create_access_entry(self, *, principalArn: str, kubernetesGroups: list[str], **_: Any) -> None:
        if principalArn in self.entries:
            raise self.exceptions.ResourceInUseException
        self.entries[principalArn] = kubernetesGroups

    def describe_access_entry(self, *, principalArn: str, **_: Any) -> dict[str, Any]:
        return {"accessEntry": {"kubernetesGroups": self.entries[principalArn]}}


class AwsStack:
    region = "us-west-2"

    def __init__(self) -> None:
        self.env = {"NODE_QUEUE_PREFIX": "pw-node", "SWEEP_ROLE_ARN": ROLE}
        self.eks = Eks()
        self.regions: list[str | None] = []

    def client(self, service: str, region: str | None = None) -> Any:
        assert service == "eks"
        self.regions.append(region)
        return self.eks


class Api:
    """The cluster's API as the operator: what the install creates, and what it saw of the table then."""

    def __init__(self, store: MemoryJobStore, *, error: Exception | None = None) -> None:
        self.store, self.error = store, error
        self.created: list[str] = []
        self.setup_seen: list[ClusterSetup | None] = []
        self.served_seen: list[bool] = []

    def get_object(self, api_version: str, plural: str, name: str, namespace: str | None = None) -> None:
        recorded = self.store.get_cluster("prod")
        self.setup_seen.append(recorded.setup if recorded else None)
        # What record_status asks before it takes a hello of cluster prod
        self.served_seen.append(ServedClusters(self.store, "home").serves("prod"))
        if self.error is not None:
            raise self.error

    def create_object(self, api_version: str, plural: str, body: dict[str, Any], namespace: str | None) -> None:
        self.created.append(body["metadata"]["name"])

    def list_objects(self, *args: Any) -> list[Any]:
        return []


def add(store: MemoryJobStore, api: Api, reach: ClusterReach, stack: AwsStack | None = None, *,
        answers: list[ClusterReach] | None = None, sleeps: list[float] | None = None, region: str = "") -> list[str]:
    """`cluster add prod`; the check answers `answers` in turn (the last one again), else `reach`."""
    lines: list[str] = []
    queue = list(answers or [reach])

    @contextmanager
    def open_api(cluster: RegisteredCluster) -> Iterator[Api]:
        yield api

    def reached(name: str) -> ClusterReach:
        # Checked once the cluster is recorded: the function reads its endpoint from the table
        assert name == "prod" and store.get_cluster(name) is not None
        return queue.pop(0) if len(queue) > 1 else queue[0]

    register_cluster(stack or AwsStack(), store, "prod", {"env": "prod"}, [DAEMON_SET], lines.append, open_api, reached,
                     sleep=(sleeps if sleeps is not None else []).append, region=region)
    return lines


V1_33 = ClusterReach("prod", version="v1.33.5-eks-3025e55")


def test_the_cluster_is_recorded_installing_before_anything_is_installed_then_installed() -> None:
    store = MemoryJobStore()
    api = Api(store)

    lines = add(store, api, V1_33)

    # While the install ran, the cluster was recorded, Installing, and served: an agent's first hello counts
    assert (api.setup_seen, api.served_seen, api.created) == ([ClusterSetup.INSTALLING], [True], ["prewarm-agent"])
    recorded = store.get_cluster("prod")
    assert recorded is not None and recorded.setup is ClusterSetup.INSTALLED and recorded.setup_message == ""
    assert lines[1:] == ["cluster/prod recorded (Installing): the stack serves it, its agents' hellos are accepted",
                         "cluster prod reached from the stack's network: Kubernetes v1.33.5-eks-3025e55",
                         "daemonset.apps/prewarm-agent created (namespace prewarm-system)"], lines


def test_a_cluster_in_another_region_is_described_there_and_recorded_with_its_region() -> None:
    # Before: EKS was asked in the stack's Region alone, and the cluster item held no Region.
    store, stack = MemoryJobStore(), AwsStack()
    add(store, Api(store), V1_33, stack, region="eu-west-1")
    recorded = store.get_cluster("prod")
    assert recorded is not None and recorded.region == "eu-west-1" and stack.regions == ["eu-west-1"]
    # The stack's own Region, named or not, is recorded as none: its nodes pull the pushed image
    add(store, Api(store), V1_33, stack, region="us-west-2")
    recorded = store.get_cluster("prod")
    assert recorded is not None and recorded.region == "" and stack.regions[-1] is None


@pytest.mark.parametrize(("reach", "why"), [
    (ClusterReach("prod", error="cluster prod cannot be reached: connection timed out (GET https://prod.example/version)"),
     "cluster prod cannot be reached from the stack's network: cluster prod cannot be reached: connection timed out"),
    (ClusterReach("prod", version="v1.29.8-eks-a737599"),
     "cluster prod runs Kubernetes v1.29.8-eks-a737599, older than 1.30: the ValidatingAdmissionPolicy the install "
     "applies is GA from 1.30; upgrade the cluster"),
])
def test_a_cluster_the_stack_cannot_reach_or_older_than_1_30_is_refused_before_anything_is_installed(
        reach: ClusterReach, why: str) -> None:
    store = MemoryJobStore()
    api = Api(store)

    with pytest.raises(RegistrationError) as refused:
        add(store, api, reach)

    assert refused.value.message.startswith(why)
    assert refused.value.message.endswith("(cluster prod is recorded Failed: fix that, then `prewarm cluster add prod` "
                                          "again, or `prewarm cluster remove prod`)")
    assert api.created == [] and api.setup_seen == []
    recorded = store.get_cluster("prod")
    assert recorded is not None and recorded.setup is ClusterSetup.FAILED and recorded.setup_message.startswith(why)


def test_a_failed_install_leaves_the_cluster_failed_with_why_and_adding_it_again_finishes_the_job() -> None:
    store = MemoryJobStore()
    stack = AwsStack()
    refused = ClusterAuthError("GET /apis/apps/v1/namespaces/prewarm-system/daemonsets/prewarm-agent: 401 Unauthorized")

    with pytest.raises(RegistrationError, match=r"401 Unauthorized \(cluster prod is recorded Failed"):
        add(store, Api(store, error=refused), V1_33, stack)

    (health,) = [h for h in recorded_health(store, "home") if h.name == "prod"]
    assert (health.setup, health.failed) == ("Failed", True)
    assert health.setup_message.endswith("401 Unauthorized")
    first = store.get_cluster("prod")

    # When it is added again, with the operator's access fixed
    api = Api(store)
    add(store, api, V1_33, stack)

    # Then it is installed, its first registration's time kept
    assert api.created == ["prewarm-agent"]
    again = store.get_cluster("prod")
    assert again is not None and first is not None
    assert (again.setup, again.setup_message, again.added_at) == (ClusterSetup.INSTALLED, "", first.added_at)


REFUSED = ClusterReach("prod", error="GET /version: 401 Unauthorized: Unauthorized", unauthorized=True)


def test_a_token_refused_just_after_the_access_entries_were_created_is_checked_again_until_they_apply() -> None:
    store = MemoryJobStore()
    sleeps: list[float] = []
    lines = add(store, Api(store), V1_33, answers=[REFUSED, REFUSED, V1_33], sleeps=sleeps)
    assert sleeps == [2.0, 4.0]
    assert "cluster prod did not accept the function's token yet (new access entries take a few seconds to apply): " \
           "checking again in 2 s" in lines
    recorded = store.get_cluster("prod")
    assert recorded is not None and recorded.setup is ClusterSetup.INSTALLED


def test_a_token_still_refused_after_about_30_s_or_with_entries_that_existed_is_refused_at_once() -> None:
    store, stack = MemoryJobStore(), AwsStack()
    sleeps: list[float] = []
    with pytest.raises(RegistrationError, match="cannot be reached from the stack's network: GET /version: 401"):
        add(store, Api(store), V1_33, stack, answers=[REFUSED], sleeps=sleeps)
    assert sleeps == [2.0, 4.0, 8.0, 16.0]

    # Added again: the entries exist, so a refusal is not waited on
    sleeps.clear()
    with pytest.raises(RegistrationError):
        add(store, Api(store), V1_33, stack, answers=[REFUSED], sleeps=sleeps)
    assert sleeps == []
