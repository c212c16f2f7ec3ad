"""The doctor's judgements, on plain data: which outputs are missing, which nodes lack a ready agent,
which queues have no node, which credentials expire soon, which schedule is overdue, what each function
must be allowed, and how a result reads."""

from __future__ import annotations

from typing import Any

import pytest

from prewarm.domain.clusters import RegisteredCluster
from prewarm.domain.nodes import RegisteredNode
from prewarm.domain.schedules import SWEEP, ScheduleRun
from prewarm_cli.doctor.checks import (
    EXPIRY_WARNING_SECONDS,
    CheckResult,
    Credential,
    agent_coverage,
    agent_nodes,
    check_agent_versions,
    check_function_rbac,
    check_registered_clusters,
    earliest_expiring,
    missing_outputs,
    queue_mismatch,
    schedule_problem,
)
from prewarm_cli.doctor.identities import (
    Access,
    AccessEntry,
    CredentialTargets,
    Subject,
    map_roles,
    required_access,
    subject_of,
)
from prewarm_cli.targets.stack import STACK_OUTPUTS
from tests.support.cluster import make_node

ROLE = "arn:aws:iam::111122223333:role/prewarm-SweepRole-AbC"


def pod(name: str, node: str, *, ready: bool = True, state: dict[str, Any] | None = None) -> dict[str, Any]:
    return {"metadata": {"name": name, "namespace": "prewarm-system"}, "spec": {"nodeName": node},
            "status": {"phase": "Running", "conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
                       "containerStatuses": [{"name": "agent", "state": state or {"running": {}}}]}}


def labelled(node: dict[str, Any], **labels: str) -> dict[str, Any]:
    node["metadata"]["labels"].update(labels)
    return node


# -- how a result reads ---------------------------------------------------------------------------


def test_a_result_is_one_line_marked_ok_fail_or_skip() -> None:
    assert CheckResult("stack outputs", True).line() == "ok    stack outputs"
    assert CheckResult("node queues", False, "1 queue of departed nodes (pw-a)", "run the sweep").line() == \
        "FAIL  node queues: 1 queue of departed nodes (pw-a): run the sweep"
    assert CheckResult("function RBAC", None, "the API did not answer").line() == \
        "skip  function RBAC: the API did not answer"


def test_only_a_failure_fails_and_an_ok_line_never_shows_a_fix() -> None:
    assert CheckResult("x", False).failed and not CheckResult("x", None).failed
    assert CheckResult("x", True, "fine", "never shown").line() == "ok    x: fine"


# -- stack outputs --------------------------------------------------------------------------------


def test_missing_outputs_are_named_as_the_stack_names_them_and_optional_ones_are_not() -> None:
    env = {setting: "x" for setting in STACK_OUTPUTS.values()}
    for optional in ("KUBE_API_ENDPOINT", "KUBE_CA_DATA", "AGENT_ROLE_ARN"):
        del env[optional]
    assert missing_outputs(env, STACK_OUTPUTS) == []

    del env["DEAD_LETTER_QUEUE_URLS"]
    env["SWEEP_ROLE_ARN"] = ""
    assert missing_outputs(env, STACK_OUTPUTS) == ["DeadLetterQueueUrls", "SweepRoleArn"]


# -- agents ---------------------------------------------------------------------------------------


def test_agents_are_needed_on_ready_linux_nodes_but_not_on_fargate_or_virtual_kubelet_ones() -> None:
    nodes = [make_node("a"), make_node("not-ready", ready=False),
             labelled(make_node("windows"), **{"kubernetes.io/os": "windows"}),
             labelled(make_node("fargate"), **{"eks.amazonaws.com/compute-type": "fargate"}),
             make_node("virtual", type="virtual-kubelet")]
    assert agent_nodes(nodes) == ["a"]


def test_agents_are_not_needed_on_nodes_outside_the_daemonsets_node_selector_or_tolerations() -> None:
    daemon_set = {"spec": {"template": {"spec": {"nodeSelector": {"pool": "general"}}}}}
    tainted = make_node("tainted", pool="general")
    tainted["spec"] = {"taints": [{"key": "dedicated", "effect": "NoSchedule"}]}
    nodes = [make_node("a", pool="general"), make_node("gpu", pool="gpu"), tainted]

    assert agent_nodes(nodes, daemon_set) == ["a"]
    assert agent_coverage(nodes, [], daemon_set).problems == {"a": "no agent pod"}
    assert agent_nodes(nodes) == ["a", "gpu", "tainted"]


def test_a_node_without_a_ready_agent_pod_says_why() -> None:
    nodes = [make_node("a"), make_node("b"), make_node("c")]
    pods = [pod("prewarm-agent-1", "a"),
            pod("prewarm-agent-2", "b", ready=False, state={"terminated": {"reason": "Error", "exitCode": 137}})]

    coverage = agent_coverage(nodes, pods)

    assert coverage.needed == ("a", "b", "c") and coverage.ready == {"a"}
    assert coverage.problems == {"b": "pod prewarm-agent-2 not Ready: terminated (Error, exit 137)",
                                 "c": "no agent pod"}


def test_a_ready_pod_counts_over_a_leftover_one_on_the_same_node() -> None:
    pods = [pod("old", "a", ready=False, state={"waiting": {"reason": "CrashLoopBackOff"}}), pod("new", "a")]
    assert agent_coverage([make_node("a")], pods).ready == {"a"}
    assert agent_coverage([make_node("a")], pods[:1]).problems == {
        "a": "pod old not Ready: waiting (CrashLoopBackOff)"}


# -- node queues ----------------------------------------------------------------------------------


def test_queues_of_departed_nodes_and_ready_agents_without_a_queue_are_found() -> None:
    stray, missing = queue_mismatch("pw", {"pw-a", "pw-gone"}, nodes=["a", "b", "c"], agents=["a", "b"])
    assert (stray, missing) == (["pw-gone"], ["b"])


def test_a_node_without_a_ready_agent_needs_no_queue_yet() -> None:
    assert queue_mismatch("pw", {"pw-a"}, nodes=["a", "b"], agents=["a"]) == ([], [])


# -- credentials ----------------------------------------------------------------------------------


def test_credentials_expiring_within_two_hours_are_the_problem_soonest_first() -> None:
    now = 1_000_000.0
    fine = Credential(now + 11 * 3600, "copy")
    soon = Credential(now + EXPIRY_WARNING_SECONDS - 1, "secret a")
    gone = Credential(now - 60, "secret b")

    earliest, expiring = earliest_expiring([fine, soon, gone], now)

    assert earliest == gone and expiring == [gone, soon]
    assert earliest_expiring([fine], now) == (fine, [])
    assert earliest_expiring([], now) == (None, [])


# -- schedules ------------------------------------------------------------------------------------


@pytest.mark.parametrize(("finished_ago", "problem"), [
    (30, None), (179, None), (181, "last ran 3m1s ago"), (3600, "last ran 60m ago"),
])
def test_a_sweep_is_overdue_a_period_and_two_minutes_after_its_last_run(finished_ago: float,
                                                                         problem: str | None) -> None:
    now = 10_000.0
    run = ScheduleRun(SWEEP, started_at=now - finished_ago - 1, finished_at=now - finished_ago)
    assert schedule_problem(run, period=60, since=0, now=now) == problem


def test_a_schedule_that_never_ran_is_due_only_once_the_stack_is_older_than_its_period() -> None:
    now = 100_000.0
    assert schedule_problem(None, period=86400, since=now - 3600, now=now) is None
    assert schedule_problem(None, period=86400, since=now - 30 * 3600, now=now) == \
        "never ran, and the stack is 30h old"


def test_the_daily_round_gets_an_eighth_of_a_day_of_grace() -> None:
    now = 1_000_000.0
    late = ScheduleRun("daily-round", started_at=0, finished_at=now - 26 * 3600)
    very_late = ScheduleRun("daily-round", started_at=0, finished_at=now - 28 * 3600)
    assert schedule_problem(late, period=86400, since=0, now=now) is None
    assert schedule_problem(very_late, period=86400, since=0, now=now) == "last ran 28h ago"


# -- identities and RBAC --------------------------------------------------------------------------


def test_a_role_without_a_username_is_its_assumed_role_session_with_its_groups() -> None:
    subject = subject_of(ROLE, AccessEntry("", ("prewarm-control-plane",)), ("ignored",))
    assert subject.user == "arn:aws:sts::111122223333:assumed-role/prewarm-SweepRole-AbC/prewarm-doctor"
    assert subject.groups == ("prewarm-control-plane", "system:authenticated")


def test_without_an_entry_the_template_s_groups_are_reviewed() -> None:
    subject = subject_of(ROLE, None, ("prewarm-control-plane",))
    assert subject.groups == ("prewarm-control-plane", "system:authenticated")


def test_map_roles_match_a_role_by_its_arn_without_path() -> None:
    config_map = {"data": {"mapRoles": "- rolearn: arn:aws:iam::111122223333:role/prewarm-SweepRole-AbC\n"
                                       "  username: prewarm-sweep\n  groups: [prewarm-control-plane]\n"}}
    entries = map_roles(config_map)
    assert entries == {ROLE: AccessEntry("prewarm-sweep", ("prewarm-control-plane",))}
    assert map_roles({"data": {"mapRoles": "- : ["}}) == {} and map_roles(None) == {}


def test_each_function_needs_its_verbs_in_the_namespaces_of_jobs_and_of_the_refresher() -> None:
    targets = CredentialTargets(("team-a",), "prewarm-ecr", ("default",))
    needs = required_access({"shop"}, {("shop", "regcred")}, targets)

    assert [str(a) for a in needs["dispatch_job"]] == [
        "get nodes", "list nodes", "list pods in default", "list pods in shop", "get secrets/regcred in shop",
        "get daemonsets.apps/prewarm-agent in prewarm-system"]
    assert [str(a) for a in needs["record_status"]] == [
        "get nodes", "patch nodes", "patch nodes/status", "get configmaps/prewarm-agent in prewarm-system",
        "list pods in default", "list pods in shop"]
    assert Access("patch", "nodes", subresource="status").review(Subject("u", ()))["spec"]["resourceAttributes"] == {
        "verb": "patch", "resource": "nodes", "group": "", "version": "v1", "subresource": "status"}
    assert [str(a) for a in needs["sweep"]] == [
        "get nodes", "list nodes", "patch nodes", "get configmaps/prewarm-agent in prewarm-system",
        "create events in default"]
    assert [str(a) for a in needs["refresh_ecr_credentials"]] == [
        "list namespaces", "create secrets in team-a", "get secrets/prewarm-ecr in team-a",
        "update secrets/prewarm-ecr in team-a", "get serviceaccounts/default in team-a",
        "patch serviceaccounts/default in team-a"]
    assert required_access((), (), None)["refresh_ecr_credentials"] == []
    assert needs["sync_resources"] == []


def test_the_sync_needs_the_secrets_of_pull_secrets_only_resources() -> None:
    needs = required_access({"shop"}, {("shop", "regcred")}, None, {("shop", "regcred")})

    assert [str(a) for a in needs["sync_resources"]] == ["get secrets/regcred in shop"]


class Reviews:
    """A cluster that allows what `allowed` holds (verb, resource, namespace) and records each review."""

    host = "https://cluster"

    def __init__(self, allowed: set[tuple[str, str, str]]) -> None:
        self.allowed = allowed
        self.asked: list[dict[str, Any]] = []

    def create_object(self, api_version: str, plural: str, body: dict[str, Any],
                      namespace: str | None = None) -> dict[str, Any]:
        assert (api_version, plural) == ("authorization.k8s.io/v1", "subjectaccessreviews")
        self.asked.append(body)
        a = body["spec"]["resourceAttributes"]
        return {**body, "status": {"allowed": (a["verb"], a["resource"], a.get("namespace", "")) in self.allowed}}


def test_a_denied_verb_is_named_with_its_function_and_a_kubectl_check() -> None:
    subjects = {"sweep": subject_of(ROLE, None, ("prewarm-control-plane",)),
                "record_status": subject_of(ROLE, None, ("prewarm-control-plane",))}
    needs = {"sweep": [Access("list", "nodes")],
             "record_status": [Access("get", "nodes"), Access("list", "pods", "default")]}
    cluster = Reviews({("get", "nodes", "")})

    result = check_function_rbac(cluster, subjects, needs)

    assert result.line() == (
        "FAIL  function RBAC: sweep cannot list nodes; record_status cannot list pods in default: "
        "run `prewarm install` "
        "(it binds the functions' groups); check with "
        "`kubectl auth can-i list nodes --as prewarm --as-group prewarm-control-plane`")
    assert cluster.asked[0]["spec"]["groups"] == ["prewarm-control-plane", "system:authenticated"]


def test_a_verb_on_a_resource_of_an_api_group_is_reviewed_and_checked_in_that_group() -> None:
    subjects = {"dispatch_job": subject_of(ROLE, None, ("prewarm-control-plane",))}
    needs = {"dispatch_job": [Access("get", "daemonsets", "prewarm-system", "prewarm-agent", "apps")]}
    cluster = Reviews(set())

    result = check_function_rbac(cluster, subjects, needs)

    assert cluster.asked[0]["spec"]["resourceAttributes"] == {
        "verb": "get", "resource": "daemonsets", "group": "apps", "version": "v1", "namespace": "prewarm-system",
        "name": "prewarm-agent"}
    assert result.line().endswith(
        "check with `kubectl auth can-i get daemonsets.apps/prewarm-agent -n prewarm-system --as prewarm "
        "--as-group prewarm-control-plane`")


def test_all_verbs_allowed_is_ok() -> None:
    cluster = Reviews({("list", "nodes", "")})
    result = check_function_rbac(cluster, {"sweep": subject_of(ROLE, None, ("g",))},
                                 {"sweep": [Access("list", "nodes")]})
    assert result.line() == "ok    function RBAC: 1 permissions of 1 functions allowed"


def registered(name: str, version: str) -> RegisteredNode:
    return RegisteredNode(name=name, labels={}, architecture="arm64", os="linux", queue_url=f"q/{name}",
                          last_hello=0.0, agent_version=version)


def test_agents_of_another_version_than_the_stack_are_named_with_theirs() -> None:
    nodes = [registered("n1", "0.2.0"), registered("n2", "0.1.0"), registered("n3", "")]
    result = check_agent_versions(nodes, "0.2.0")
    assert result.line() == ("FAIL  agent versions: 2 of 3 agents are not 0.2.0: n2 (0.1.0), n3 (unknown): "
                             "roll the DaemonSet to the stack's version: `prewarm install` (its default image is "
                             "prewarm-agent:0.2.0)")
    assert check_agent_versions(nodes[:1], "0.2.0").line() == "ok    agent versions: 1 agents, all 0.2.0"


def test_agent_versions_are_skipped_without_a_stack_version_or_agents() -> None:
    assert check_agent_versions([registered("n1", "0.1.0")], "").ok is None
    assert check_agent_versions([], "0.1.0").line() == "skip  agent versions: no agent has said hello yet"


# -- registered clusters ----------------------------------------------------------------------------


def test_registered_clusters_fail_when_the_functions_could_not_reach_one_lately() -> None:
    now = 1_800_000_000.0
    fine = RegisteredCluster("prod-eu", checked_at=now - 30, reachable=True, agents=12)
    down = RegisteredCluster("prod-us", checked_at=now - 60, reachable=False,
                             reason="Unauthorized: the EKS token was refused")
    stale = RegisteredCluster("staging", checked_at=now - 3600, reachable=True)
    new = RegisteredCluster("gpu")
    assert check_registered_clusters([], now=now).line() == \
        "ok    registered clusters: none: the stack serves its own cluster only"
    assert check_registered_clusters([fine], now=now).line() == \
        "ok    registered clusters: prod-eu (reached 30s ago, 12 agents)"
    result = check_registered_clusters([fine, down, stale, new], now=now)
    assert result.failed
    assert result.detail == ("prod-us: unreachable 60s ago: Unauthorized: the EKS token was refused; "
                             "staging: last reached 60m ago; gpu: not reached by the sweep yet")
    assert "prewarm cluster add NAME" in result.fix
