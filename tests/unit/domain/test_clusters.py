"""Cluster names, scoped names, queue names and rules' cluster selectors."""

from __future__ import annotations

import pytest

from prewarm.domain.clusters import (
    ClusterCircuit,
    ClusterError,
    ClusterReach,
    ClusterSelector,
    RegisteredCluster,
    kubernetes_version,
    probe_delay,
    resolve_cluster,
    scoped,
    select_clusters,
    split_scoped,
)
from prewarm.domain.jobs import job_key
from prewarm.domain.kubernetes import JobValidationError
from prewarm.domain.manifests import parse_manifest
from prewarm.domain.messages import Hello, RequiredImages, cluster_queue_prefix, is_cluster_queue, node_queue_name

CLUSTERS = [RegisteredCluster(""), RegisteredCluster("prod-eu", labels={"env": "prod"}),
            RegisteredCluster("staging", labels={"env": "staging"})]


def test_the_stacks_own_cluster_keeps_its_names_and_others_are_prefixed() -> None:
    assert job_key("ml", "web") == "ml/web"
    assert job_key("ml", "web", "prod-eu") == "prod-eu:ml/web"
    assert split_scoped("prod-eu:ml/web") == ("prod-eu", "ml/web")
    assert split_scoped("ml/web") == ("", "ml/web")
    assert scoped("prod-eu", "ip-10-0-1-1") == "prod-eu:ip-10-0-1-1"


@pytest.mark.parametrize("name", ["", "-a", "a b", "a:b", "a.b", "x" * 101])
def test_a_cluster_name_eks_refuses_is_refused_naming_it(name: str) -> None:
    with pytest.raises(ClusterError, match="invalid cluster name"):
        resolve_cluster(name or "-", "home")
    with pytest.raises(ClusterError):
        RegisteredCluster(name or "-")


def test_labels_are_kubernetes_labels() -> None:
    with pytest.raises(ClusterError, match=r"cluster prod: labels\[env/\]"):
        RegisteredCluster("prod", labels={"env/": "x"})


def test_the_own_cluster_is_named_by_its_cluster_name_or_not_at_all() -> None:
    assert resolve_cluster(None, "home") == resolve_cluster("home", "home") == ""
    assert resolve_cluster("prod-eu", "home") == "prod-eu"


def test_node_queues_of_two_clusters_never_share_a_name_and_list_apart() -> None:
    own, prod = node_queue_name("pw", "ip-10-0-1-1"), node_queue_name("pw", "ip-10-0-1-1", "prod-eu")
    assert own == "pw-ip-10-0-1-1" and own != prod
    assert prod.startswith(cluster_queue_prefix("pw", "prod-eu"))
    assert is_cluster_queue("pw", own) and not is_cluster_queue("pw", prod)
    assert is_cluster_queue("pw", prod, "prod-eu") and not is_cluster_queue("pw", prod, "staging")
    # A name at the 80-character limit still ends in the digest that keeps it apart
    long = node_queue_name("pw", "n" * 120, "prod-eu")
    assert len(long) <= 80 and long != node_queue_name("pw", "n" * 121, "prod-eu")


def test_a_rule_selects_every_cluster_by_default_or_by_name_or_label() -> None:
    assert [c.name for c in select_clusters(None, CLUSTERS, "home")] == ["", "prod-eu", "staging"]
    by_label = ClusterSelector.model_validate({"matchLabels": {"env": "prod"}})
    assert [c.name for c in select_clusters(by_label, CLUSTERS, "home")] == ["prod-eu"]
    by_name = ClusterSelector.model_validate({"names": ["home", "staging"]})
    assert [c.name for c in select_clusters(by_name, CLUSTERS, "home")] == ["", "staging"]


def test_a_rules_cluster_selector_is_validated_naming_the_field() -> None:
    doc = {"apiVersion": "prewarm.dev/v1alpha1", "kind": "PrewarmRule", "metadata": {"name": "r"},
           "spec": {"repositories": ["a"], "clusters": {"names": ["prod", "prod", "bad name"]}}}
    with pytest.raises(JobValidationError) as caught:
        parse_manifest(doc)
    text = str(caught.value)
    assert "spec.clusters.names[1]" in text and 'duplicate cluster name "prod"' in text
    assert "spec.clusters.names[2]" in text
    doc["spec"]["clusters"] = {"names": ["prod"], "matchLabels": {"env": "prod"}}  # type: ignore[index]
    with pytest.raises(JobValidationError, match="names cannot be combined with matchLabels"):
        parse_manifest(doc)


def test_messages_name_a_registered_cluster_and_leave_the_field_out_for_the_own() -> None:
    assert "cluster" not in Hello(node="n").model_dump()
    assert Hello(node="n", cluster="prod-eu").model_dump()["cluster"] == "prod-eu"
    assert "cluster" not in RequiredImages(node="n", as_of=1).model_dump()
    with pytest.raises(ValueError, match="cluster"):
        Hello(node="n", cluster="a:b")


def test_tasks_carry_their_jobs_cluster_but_keep_it_off_the_wire_so_every_agent_still_reads_them() -> None:
    from prewarm.domain.messages import CancelTask, PullTask, parse_node_message

    task = PullTask(job="prod-eu:ml/web", job_uid="u", round=1, node="n", image="nginx:1", cluster="prod-eu")
    cancel = CancelTask(job="prod-eu:ml/web", job_uid="u", round=1, node="n", cluster="prod-eu")
    assert task.cluster == cancel.cluster == "prod-eu"
    # The wire format is the one agents have always read: no cluster field
    assert "cluster" not in task.model_dump() and "cluster" not in cancel.model_dump_json()
    # A task read without it (every task on the wire) is of the stack's own cluster
    assert parse_node_message(task.model_dump_json()).cluster == ""
    with pytest.raises(ValueError, match="cluster"):
        PullTask(job="ml/web", job_uid="u", round=1, node="n", image="nginx:1", cluster="a:b")


def test_a_rules_and_a_jobs_selectors_share_one_rule_for_names_or_labels() -> None:
    from prewarm.domain.kubernetes import NamesOrLabelSelector
    from prewarm.domain.placement import NodeSelector

    assert issubclass(ClusterSelector, NamesOrLabelSelector) and issubclass(NodeSelector, NamesOrLabelSelector)
    for selector, noun in ((ClusterSelector, "cluster name"), (NodeSelector, "node name")):
        with pytest.raises(ValueError, match=f'duplicate {noun} "a"'):
            selector.model_validate({"names": ["a", "a"]})
        with pytest.raises(ValueError, match="names cannot be combined with matchLabels"):
            selector.model_validate({"names": ["a"], "matchLabels": {"k": "v"}})


def test_a_clusters_circuit_opens_on_a_failure_lets_one_trial_through_and_doubles_while_it_keeps_failing() -> None:
    circuit = ClusterCircuit()
    assert circuit.allows(0.0) and not circuit.is_open
    # A failure opens it for 10 s
    circuit = circuit.failed(100.0, "connection refused")
    assert not circuit.allows(109.9) and circuit.allows(110.0)
    assert circuit.skipped(104.0) == "connection refused; not called again for 6 s"
    # At its time one call goes; the calls behind it wait for its answer
    trial = circuit.trial(110.0)
    assert not trial.allows(110.5)
    # failing again, it opens for 20 s, then 40, up to 120
    again = trial.failed(110.5, "connection refused")
    assert (again.retry_at, again.failures) == (130.5, 2)
    longest = again
    for _ in range(10):
        longest = longest.failed(0.0, "down")
    assert longest.retry_at == 120.0
    # an answer closes it; a server's Retry-After is honoured within the most
    assert again.answered() == ClusterCircuit()
    assert ClusterCircuit().failed(0.0, "429", retry_after=45).retry_at == 45.0
    assert ClusterCircuit().failed(0.0, "429", retry_after=900).retry_at == 120.0


def test_a_probe_calls_through_an_open_circuit_at_its_first_pace_never_before_a_retry_after() -> None:
    # Given a circuit opened three times: the other calls wait 40 s
    circuit = ClusterCircuit().failed(0.0, "refused").failed(10.0, "refused").failed(30.0, "refused")
    assert not circuit.allows(69.0)
    # Then a probe may call 10 s after the last failure, not before, and the next probe 10 s after that
    assert not circuit.allows_probe(39.9) and circuit.allows_probe(40.0)
    probed = circuit.probe_trial(40.0)
    assert not probed.allows_probe(49.9) and probed.allows_probe(50.0)
    # while the other calls' spell stays as it was
    assert probed.retry_at == circuit.retry_at and not probed.allows(69.0)
    # A closed circuit lets probes through as any call, and a probe waits out a server's Retry-After
    assert ClusterCircuit().allows_probe(0.0) and ClusterCircuit().probe_trial(0.0) == ClusterCircuit()
    throttled = ClusterCircuit().failed(0.0, "429", retry_after=45)
    assert not throttled.allows_probe(44.0) and throttled.allows_probe(45.0)
    # and a trial of the other calls puts the next probe 10 s off
    assert not circuit.trial(70.0).allows_probe(75.0)


@pytest.mark.parametrize(("seconds", "delay"), [(0, 10), (10, 10), (10.2, 11), (600, 600), (5000, 900)])
def test_a_probes_delay_is_at_least_its_period_and_at_most_sqs_s_900_s(seconds: float, delay: int) -> None:
    assert probe_delay(seconds) == delay


@pytest.mark.parametrize(("info", "found"), [
    ({"major": "1", "minor": "30+", "gitVersion": "v1.30.4-eks-a737599"}, (1, 30)),
    ({"major": "1", "minor": "29", "gitVersion": "v1.29.0"}, (1, 29)),
    ({"gitVersion": "1.31.2"}, (1, 31)),
    ({"major": "1", "minor": "28+"}, (1, 28)),  # no gitVersion: major and minor
    ({"gitVersion": "v1.32.1", "major": "9", "minor": "9"}, (1, 32)),  # gitVersion first
    ({"gitVersion": "unknown"}, None),
    ({}, None),
])
def test_a_kubernetes_version_is_read_from_git_version_else_major_and_minor(info: dict[str, str],
                                                                             found: tuple[int, int] | None) -> None:
    assert kubernetes_version(info) == found


def test_a_cluster_unreachable_older_than_1_30_or_with_no_version_is_refused_naming_what_was_found() -> None:
    assert ClusterReach("prod", version="v1.30.0").problem() is None
    assert ClusterReach("prod", version="v2.0.1").problem() is None
    assert ClusterReach("prod", error="connection refused").problem() == (
        "cluster prod cannot be reached from the stack's network: connection refused")
    assert ClusterReach("prod", version="v1.29.15-eks-1").problem() == (
        "cluster prod runs Kubernetes v1.29.15-eks-1, older than 1.30: the ValidatingAdmissionPolicy the install "
        "applies is GA from 1.30; upgrade the cluster")
    assert ClusterReach("prod", version="v0.31.0").problem() is not None
    assert ClusterReach.of_version("prod", {"major": "1", "minor": "31+"}).version == "1.31"
    unreadable = ClusterReach.of_version("prod", {"platform": "x"})
    assert unreadable.problem() == ("cluster prod answered /version with no Kubernetes version Prewarm can read "
                                    "({'platform': 'x'})")


def test_a_reachability_answer_goes_through_json_and_anything_else_is_refused_naming_it() -> None:
    reach = ClusterReach("prod", version="v1.33.5")
    assert ClusterReach.from_json(reach.to_json()) == reach
    refused = ClusterReach("prod", error="GET /version: 401 Unauthorized", unauthorized=True)
    assert ClusterReach.from_json(refused.to_json()) == refused
    assert ClusterReach.from_json({"cluster": "prod", "version": "", "error": "timed out"}).error == "timed out"
    for doc in (None, {"cluster": "prod"}, {"version": "v1.30.0"}, ["prod"]):
        with pytest.raises(ValueError, match="not a reachability answer"):
            ClusterReach.from_json(doc)
