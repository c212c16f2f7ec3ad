"""Issue #36, warm as a node fact after the first hello: the `PrewarmWarm` condition of a node follows its
pulls (a node that never held the startup taint, a new `Never` job's digest), an unverified node gets its
condition once its cluster answers, and a rule's `spec.nodeLabel` is on a node exactly while the images of
the rule's jobs are all there."""

from __future__ import annotations

from typing import Any

import pytest

from prewarm.domain.boot import CONDITION_TYPE, PRESENT_AT_BOOT, PULLED, PULLING
from prewarm.domain.clusters import RegisteredCluster
from prewarm.domain.jobs import NODE_LABEL_ANNOTATION, job_key
from prewarm.domain.messages import ALREADY_PRESENT, Hello, StatusReport
from prewarm.domain.rules import REPOSITORY_ANNOTATION, RULE_ANNOTATION, TAG_ANNOTATION
from prewarm.services.dispatch import plan_job
from prewarm.services.jobs import apply_manifest
from prewarm.services.ports import ClusterUnavailableError
from prewarm.services.schedules import SweepSettings, repull_daily, sweep
from prewarm.services.status_batches import StatusBatchOutcome, record_status
from tests.support.cluster import FakeCluster, make_node, recorded_reads
from tests.support.cluster_directory import clusters_of
from tests.support.control_plane import ControlPlane
from tests.support.manifests import job_doc

REPO = "123456789012.dkr.ecr.us-west-2.amazonaws.com/ml/torch"
IMAGE = f"{REPO}@sha256:{'a' * 64}"
NEWER = f"{REPO}@sha256:{'c' * 64}"
LABEL = "prewarm.dev/torch"
GPU = {"matchLabels": {"pool": "gpu"}}


def never_job(plane: ControlPlane, name: str, image: str) -> None:
    apply_manifest(plane.store, job_doc(name, image=image, selector=GPU, completionPolicy={"type": "Never"}),
                   now=plane.now())
    plane.plan(name)


def rule_job(plane: ControlPlane, name: str, image: str) -> None:
    """A rule's job as `PrewarmRule.job_for_push` makes it for a rule with `spec.nodeLabel: prewarm.dev/torch`."""
    doc = job_doc(name, image=image, selector=GPU, parallelism=10)
    repository = image.partition("/")[2].partition("@")[0]
    doc["metadata"]["annotations"] = {NODE_LABEL_ANNOTATION: LABEL, RULE_ANNOTATION: "torch",
                                      REPOSITORY_ANNOTATION: repository, TAG_ANNOTATION: "v1"}
    apply_manifest(plane.store, doc, now=plane.now())
    plane.plan(name)


def report(plane: ControlPlane, name: str, node: str, phase: str, **fields: Any) -> StatusBatchOutcome:
    """A report as the status queue delivers it: through `record_status`, in a batch of its own."""
    record = plane.store.get_job(job_key("default", name))
    assert record is not None
    message = StatusReport(job=record.key, job_uid=record.uid, round=record.round, node=node, phase=phase,
                           seq=int(plane.now() * 1000), **fields)
    return record_status(plane.store, plane.queues, clusters_of(plane.store, plane.cluster), [("r", message)],
                         now=plane.now())


def hello(plane: ControlPlane, name: str, images: list[str] | None = None) -> None:
    record_status(plane.store, plane.queues, clusters_of(plane.store, plane.cluster),
                  [("h", Hello(node=name, labels={"pool": "gpu"}, images=images or []))], now=plane.now())


def condition(node: dict[str, Any]) -> tuple[str, str, str]:
    (found,) = [c for c in node.get("status", {}).get("conditions", []) if c["type"] == CONDITION_TYPE]
    return found["status"], found["reason"], found["message"]


def test_an_untainted_node_s_condition_turns_true_once_its_pull_succeeds(plane: ControlPlane) -> None:
    # Given a Never job, and a node without the startup taint whose first hello found nothing of its image
    never_job(plane, "torch", IMAGE)
    node = make_node("gpu-1", pool="gpu")
    plane.cluster.nodes.append(node)
    hello(plane, "gpu-1")
    assert condition(node)[:2] == ("False", PULLING)

    # When its agent pulls it
    report(plane, "torch", "gpu-1", "Pulling", bytes_done=0, bytes_total=1000)
    assert condition(node)[:2] == ("False", PULLING)
    report(plane, "torch", "gpu-1", "Succeeded", bytes_done=1000, bytes_total=1000)

    # Then its condition says so, without a Warmed (only a tainted node's agent sends one)
    assert condition(node) == ("True", PULLED, "all 1 image required present (0 present at boot)")


def test_a_new_never_job_turns_a_warm_node_s_condition_false_until_its_image_is_there(plane: ControlPlane) -> None:
    # Given a node warm at boot for the one Never job selecting it
    never_job(plane, "torch", IMAGE)
    node = make_node("gpu-1", pool="gpu")
    plane.cluster.nodes.append(node)
    hello(plane, "gpu-1", images=[IMAGE])
    assert condition(node)[:2] == ("True", PRESENT_AT_BOOT)
    report(plane, "torch", "gpu-1", "Succeeded", message=ALREADY_PRESENT)
    assert condition(node)[:2] == ("True", PRESENT_AT_BOOT)

    # When a second Never job (a new digest) selects it and its agent starts pulling
    never_job(plane, "torch-v2", NEWER)
    report(plane, "torch-v2", "gpu-1", "Pulling", bytes_done=0, bytes_total=1000)

    # Then it is not warm until that pull succeeds, and the condition names what is missing
    assert condition(node) == ("False", PULLING, f"1 of 2 images required present; pulling {NEWER}")
    report(plane, "torch-v2", "gpu-1", "Succeeded", bytes_done=1000, bytes_total=1000)
    assert condition(node) == ("True", PULLED, "all 2 images required present (1 present at boot)")


def test_a_node_in_no_never_job_or_labelled_job_is_not_read_on_reports(plane: ControlPlane) -> None:
    # Given a plain Always job (no rule label) pulling on a node
    apply_manifest(plane.store, job_doc("plain", image=IMAGE, selector=GPU), now=plane.now())
    plane.cluster.nodes.append(make_node("gpu-1", pool="gpu"))
    plane.plan("plain")
    reads = recorded_reads(plane.cluster)

    report(plane, "plain", "gpu-1", "Succeeded", bytes_done=10, bytes_total=10)

    # Then its reports cost no call to the cluster
    assert reads == [] and plane.cluster.writes == []


def test_a_plain_job_s_reports_on_a_node_of_a_never_job_cost_no_call_to_the_cluster(plane: ControlPlane) -> None:
    # Given a node warm for a running Never job, and a plain Always job pulling on it
    never_job(plane, "torch", IMAGE)
    node = make_node("gpu-1", pool="gpu")
    plane.cluster.nodes.append(node)
    hello(plane, "gpu-1", images=[IMAGE])
    apply_manifest(plane.store, job_doc("plain", image=NEWER, selector=GPU), now=plane.now())
    plane.plan("plain")
    before, written = condition(node), list(plane.cluster.writes)
    reads = recorded_reads(plane.cluster)

    # When the plain job's pull starts and succeeds there
    report(plane, "plain", "gpu-1", "Pulling", bytes_done=0, bytes_total=10)
    report(plane, "plain", "gpu-1", "Succeeded", bytes_done=10, bytes_total=10)

    # Then its Node is neither read nor written: nothing its condition or labels are judged from changed
    assert reads == [] and plane.cluster.writes == written and condition(node) == before


def test_a_rule_s_node_label_is_set_once_its_images_are_there_and_removed_while_a_new_digest_is_not(
    plane: ControlPlane,
) -> None:
    # Given a rule's job (the rule has spec.nodeLabel) on two nodes
    nodes = [make_node(f"gpu-{i}", pool="gpu") for i in range(2)]
    plane.cluster.nodes.extend(nodes)
    rule_job(plane, "torch-aaaa", IMAGE)

    # When one node's pull succeeds
    report(plane, "torch-aaaa", "gpu-0", "Pulling", bytes_done=0, bytes_total=1000)
    assert LABEL not in nodes[0]["metadata"]["labels"]
    report(plane, "torch-aaaa", "gpu-0", "Succeeded", bytes_done=1000, bytes_total=1000)

    # Then that node carries the label, the other (still pulling) does not
    assert nodes[0]["metadata"]["labels"][LABEL] == "true"
    assert LABEL not in nodes[1]["metadata"]["labels"]
    # ... and the last node's success, which completes the job, labels it all the same
    report(plane, "torch-aaaa", "gpu-1", "Succeeded", bytes_done=1000, bytes_total=1000)
    assert nodes[1]["metadata"]["labels"][LABEL] == "true"

    # When a new digest is pushed (the rule's next job) and gpu-0 starts pulling it
    rule_job(plane, "torch-cccc", NEWER)
    report(plane, "torch-cccc", "gpu-0", "Pulling", bytes_done=0, bytes_total=1000)

    # Then gpu-0 loses the label until that pull succeeds; a failed pull keeps gpu-1 without it
    assert LABEL not in nodes[0]["metadata"]["labels"]
    report(plane, "torch-cccc", "gpu-0", "Succeeded", bytes_done=1000, bytes_total=1000)
    assert nodes[0]["metadata"]["labels"][LABEL] == "true"
    report(plane, "torch-cccc", "gpu-1", "Failed", message="403 from the registry")
    assert LABEL not in nodes[1]["metadata"]["labels"]
    # and the node's other labels are untouched
    assert nodes[0]["metadata"]["labels"]["pool"] == "gpu"


def test_an_unverified_node_gets_its_condition_once_its_cluster_answers(plane: ControlPlane) -> None:
    # Given prod-eu with a running Never job for pool=gpu, and p-1's hello while prod-eu's API is down
    plane.store.put_cluster(RegisteredCluster("prod-eu", endpoint="https://prod.example"))
    node = make_node("p-1", pool="gpu")
    prod = FakeCluster(nodes=[node])
    apply_manifest(plane.store, job_doc("keep", image=IMAGE, selector=GPU, completionPolicy={"type": "Never"}),
                   now=plane.now(), cluster="prod-eu")
    plan_job(plane.store, prod, plane.queues, "prod-eu:default/keep", now=plane.now())

    class Down(FakeCluster):
        def get_node(self, name: str) -> dict[str, Any] | None:
            raise ClusterUnavailableError("cluster prod-eu cannot be reached: connection refused")

    record_status(plane.store, plane.queues, clusters_of(plane.store, None, {"prod-eu": Down(nodes=[node])}),
                  [("h", Hello(node="p-1", cluster="prod-eu", labels={"pool": "gpu"}, images=[IMAGE]))],
                  now=plane.now())
    assert [c["type"] for c in node["status"]["conditions"]] == ["Ready"]

    # When the sweep passes over prod-eu once it answers
    result = sweep(plane.store, plane.queues, clusters_of(plane.store, None, {"prod-eu": prod}), now=plane.now(),
                   config=SweepSettings(prefix=plane.queues.prefix))

    # Then p-1 is verified and its condition says its image was there at boot
    assert result.nodes_verified == ["prod-eu:p-1"]
    assert condition(node)[:2] == ("True", PRESENT_AT_BOOT)


def test_the_sweep_repairs_a_condition_and_a_label_a_report_could_not_write(plane: ControlPlane,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    # Given a node pulling a Never job's image and a labelled rule's (still running: another node pulls it too),
    # whose Node refused every write meanwhile
    node = make_node("gpu-1", pool="gpu")
    plane.cluster.nodes.extend([node, make_node("gpu-2", pool="gpu")])
    never_job(plane, "torch", IMAGE)
    rule_job(plane, "tok-aaaa", NEWER)
    hello(plane, "gpu-1")
    assert condition(node)[:2] == ("False", PULLING)

    def refused(*args: Any) -> Any:
        raise ClusterUnavailableError("the API server is restarting")

    with monkeypatch.context() as refusing:
        refusing.setattr(plane.cluster, "patch_node_status", refused)
        refusing.setattr(plane.cluster, "patch_node", refused)
        report(plane, "torch", "gpu-1", "Succeeded", bytes_done=10, bytes_total=10)
        report(plane, "tok-aaaa", "gpu-1", "Pulling", bytes_done=0, bytes_total=10)
        outcome = report(plane, "tok-aaaa", "gpu-1", "Succeeded", bytes_done=10, bytes_total=10)
    assert outcome.retry_ids == []  # a refused write never sends a report back
    assert condition(node)[:2] == ("False", PULLING) and LABEL not in node["metadata"]["labels"]

    # When the sweep runs: not in a run of its repair, then in one (the node's turn: it is the only one)
    repairing = (plane.now() // 600 + 1) * 600  # the sweep's minute (run) 0 of 10
    sweep(plane.store, plane.queues, clusters_of(plane.store, plane.cluster), now=repairing - 60,
          config=SweepSettings(prefix=plane.queues.prefix))
    assert condition(node)[:2] == ("False", PULLING)
    sweep(plane.store, plane.queues, clusters_of(plane.store, plane.cluster), now=repairing,
          config=SweepSettings(prefix=plane.queues.prefix))

    # Then the Node says what its pulls say
    assert condition(node)[:2] == ("True", PULLED)
    assert node["metadata"]["labels"][LABEL] == "true"



def labelled_rule(plane: ControlPlane) -> None:
    """The rule `rule_job`'s jobs stand for: its `spec.nodeLabel` is what makes late joiners judged."""
    apply_manifest(plane.store, {"apiVersion": "prewarm.dev/v1alpha1", "kind": "PrewarmRule",
                                 "metadata": {"name": "torch"},
                                 "spec": {"repositories": ["ml/*"], "nodeLabel": LABEL,
                                          "template": {"spec": {"selector": GPU}}}}, now=plane.now())


def test_a_node_that_joins_after_a_rule_s_push_gets_the_label_once_its_never_job_pulled_the_image(
    plane: ControlPlane,
) -> None:
    # Given a labelled rule whose push's job (Always) is done on the node present then, and a Never job that
    # keeps the pushed digest warm on the pool
    labelled_rule(plane)
    present = make_node("gpu-0", pool="gpu")
    plane.cluster.nodes.append(present)
    rule_job(plane, "torch-aaaa", IMAGE)
    report(plane, "torch-aaaa", "gpu-0", "Succeeded", bytes_done=1000, bytes_total=1000)
    assert present["metadata"]["labels"][LABEL] == "true"
    never_job(plane, "keep", IMAGE)

    # When a node joins after that push (none since): its hello adds it to the Never job, which pulls the image
    late = make_node("gpu-1", pool="gpu")
    plane.cluster.nodes.append(late)
    hello(plane, "gpu-1")
    report(plane, "keep", "gpu-1", "Pulling", bytes_done=0, bytes_total=1000)
    assert LABEL not in late["metadata"]["labels"]
    report(plane, "keep", "gpu-1", "Succeeded", bytes_done=1000, bytes_total=1000)

    # Then it carries the label, as the node present at the push does
    assert late["metadata"]["labels"][LABEL] == "true"
    assert condition(late)[:2] == ("True", PULLED)


def test_a_late_node_with_the_image_at_boot_gets_the_label_but_not_while_another_rule_image_is_missing(
    plane: ControlPlane,
) -> None:
    # Given a labelled rule with two images pushed (two repositories), and a Never job keeping one of them warm
    labelled_rule(plane)
    plane.cluster.nodes.append(make_node("gpu-0", pool="gpu"))
    rule_job(plane, "torch-aaaa", IMAGE)
    rule_job(plane, "tok-cccc", f"{REPO}-tokenizer@sha256:{'c' * 64}")
    never_job(plane, "keep", IMAGE)

    # When a node booted with that one image joins, and its Never task finds it present
    late = make_node("gpu-1", pool="gpu")
    plane.cluster.nodes.append(late)
    hello(plane, "gpu-1", images=[IMAGE])
    report(plane, "keep", "gpu-1", "Succeeded", message=ALREADY_PRESENT)

    # Then it is not labelled: the rule's other image is on it by no account
    assert LABEL not in late["metadata"]["labels"]

    # When a Never job keeps the other image warm too, and it is pulled there
    never_job(plane, "keep-tok", f"{REPO}-tokenizer@sha256:{'c' * 64}")
    report(plane, "keep-tok", "gpu-1", "Succeeded", bytes_done=10, bytes_total=10)

    # Then it is
    assert late["metadata"]["labels"][LABEL] == "true"


def test_a_daily_re_pull_of_digests_the_node_holds_leaves_its_condition_true(plane: ControlPlane) -> None:
    # Given a node warm for two Never jobs, whose kubelet lists both digests on its Node
    never_job(plane, "torch", IMAGE)
    never_job(plane, "torch-next", NEWER)
    node = make_node("gpu-1", pool="gpu")
    plane.cluster.nodes.append(node)
    hello(plane, "gpu-1")
    for name in ("torch", "torch-next"):
        report(plane, name, "gpu-1", "Succeeded", bytes_done=1000, bytes_total=1000)
    node["status"]["images"] = [{"names": [IMAGE, f"{REPO}:v1"], "sizeBytes": 1000},
                                {"names": [NEWER], "sizeBytes": 1000}]
    warm = condition(node)
    assert warm[:2] == ("True", PULLED)

    # When the daily round re-pulls both: one job's task finds its image there while the other's is still
    # waiting, then pulling again (imagePullPolicy Always)
    assert sorted(repull_daily(plane.store)) == [job_key("default", "torch"), job_key("default", "torch-next")]
    plane.plan("torch")
    plane.plan("torch-next")
    report(plane, "torch", "gpu-1", "Succeeded", message=ALREADY_PRESENT)
    report(plane, "torch-next", "gpu-1", "Pulling", bytes_done=0, bytes_total=1000)

    # Then its condition never says Pulling: the node holds both digests all along
    assert condition(node)[:2] == ("True", PULLED)


def test_a_new_round_of_a_digest_the_node_does_not_list_still_shows_pulling(plane: ControlPlane) -> None:
    # Given a node warm for a Never job, whose Node lists no image (its image was removed since)
    never_job(plane, "torch", IMAGE)
    node = make_node("gpu-1", pool="gpu")
    plane.cluster.nodes.append(node)
    hello(plane, "gpu-1")
    report(plane, "torch", "gpu-1", "Succeeded", bytes_done=1000, bytes_total=1000)

    # When the daily round pulls it again
    repull_daily(plane.store)
    plane.plan("torch")
    report(plane, "torch", "gpu-1", "Pulling", bytes_done=0, bytes_total=1000)

    # Then the condition says so until the pull succeeds
    assert condition(node)[:2] == ("False", PULLING)
    report(plane, "torch", "gpu-1", "Succeeded", bytes_done=1000, bytes_total=1000)
    assert condition(node)[:2] == ("True", PULLED)


def test_a_daily_re_pull_keeps_the_label_of_a_node_whose_rule_job_pulled_the_image(plane: ControlPlane) -> None:
    # Given a node labelled by a rule's finished job, and a Never job keeping the same digest warm there
    labelled_rule(plane)
    node = make_node("gpu-0", pool="gpu")
    plane.cluster.nodes.append(node)
    rule_job(plane, "torch-aaaa", IMAGE)
    report(plane, "torch-aaaa", "gpu-0", "Succeeded", bytes_done=1000, bytes_total=1000)
    never_job(plane, "keep", IMAGE)
    report(plane, "keep", "gpu-0", "Succeeded", message=ALREADY_PRESENT)
    assert node["metadata"]["labels"][LABEL] == "true"

    # When the daily round re-pulls the Never job's image there (its Node lists no image: a local node)
    repull_daily(plane.store)
    plane.plan("keep")
    report(plane, "keep", "gpu-0", "Pulling", bytes_done=0, bytes_total=1000)

    # Then the label stays: the rule's own job put the image there
    assert node["metadata"]["labels"][LABEL] == "true"
