"""The control plane's flow: apply → plan → tasks → reports → exact counters, as Kruise reports them."""

from __future__ import annotations

import contextlib
from typing import Any

import pytest

from prewarm.domain.messages import CancelTask, Hello, PullTask, StatusReport
from prewarm.domain.status import DEADLINE_EXCEEDED_MESSAGE
from prewarm.services.dispatch import plan_job
from prewarm.services.jobs import apply_manifest, complete_deletion, delete_job, view_job
from prewarm.services.reports import record_report, register_node
from prewarm.services.schedules import SILENT_NODE_MESSAGE, SweepSettings, repull_daily, sweep
from tests.support.cluster import make_node, make_pod
from tests.support.cluster_directory import clusters_of
from tests.support.control_plane import ControlPlane
from tests.support.manifests import IMAGE, job_doc


def cluster_of(plane: ControlPlane, n: int, **labels: str) -> list[str]:
    names = [f"node-{i:02d}" for i in range(n)]
    plane.cluster.nodes += [make_node(name, pool="gpu", **labels) for name in names]
    plane.start_agents()
    return names


def plan(plane: ControlPlane, name: str = "warm") -> Any:
    plane.start_agents()
    return plan_job(plane.store, plane.cluster, plane.queues, f"default/{name}", now=plane.now())


def tasks_sent(plane: ControlPlane, nodes: list[str]) -> dict[str, list[Any]]:
    return {n: msgs for n in nodes if (msgs := plane.node_messages(n))}


def report(plane: ControlPlane, task: PullTask, phase: str, *, seq: int = 0, attempt: int = 1, **kw: Any) -> Any:
    msg = StatusReport(job=task.job, job_uid=task.job_uid, round=task.round, node=task.node, phase=phase,
                       seq=seq, attempt=attempt, **kw)
    return record_report(plane.store, plane.queues, msg, now=plane.now())


def counters(plane: ControlPlane, name: str = "warm") -> tuple[int, int, int, int]:
    v = view_job(plane.store, "default", name, now=plane.now())
    return (v.desired, v.active, v.succeeded, v.failed)


def assert_invariant(plane: ControlPlane, name: str = "warm") -> None:
    record = plane.store.get_job(f"default/{name}")
    assert record is not None
    tasks = [t for t in plane.store.get_tasks(record.key) if t.round == record.round]
    c = record.counters
    assert c.desired == c.waiting + c.active + c.succeeded + c.failed
    assert c.desired == len(tasks)
    assert c.succeeded == sum(t.phase.value == "Succeeded" for t in tasks)
    assert sorted(plane.store.failed_nodes(record.key)) == sorted(t.node for t in tasks if t.failed)


def test_whole_flow_exact_counters_failed_nodes_and_messages(plane: ControlPlane) -> None:
    nodes = cluster_of(plane, 5)
    plane.cluster.nodes.append(make_node("cpu-0", pool="cpu"))
    assert apply_manifest(plane.store, job_doc(selector={"matchLabels": {"pool": "gpu"}}, parallelism=5),
                          now=plane.now()).outcome == "created"
    result = plan(plane)
    assert result.selected == 5
    sent = tasks_sent(plane, [*nodes, "cpu-0"])
    assert sorted(sent) == nodes
    assert view_job(plane.store, "default", "warm", now=plane.now()).message == "job is running, progress 0.0%"

    tasks = {n: msgs[0] for n, msgs in sent.items()}
    for n in nodes:
        assert report(plane, tasks[n], "Pulling").applied
    for n in nodes[:3]:
        assert report(plane, tasks[n], "Succeeded", seq=1, image_id="sha256:1").applied
    assert report(plane, tasks[nodes[3]], "Failed", seq=1, message="401 Unauthorized").applied
    view = view_job(plane.store, "default", "warm", now=plane.now())
    assert (view.desired, view.active, view.succeeded, view.failed) == (5, 1, 3, 1)
    assert view.message == "job is running, progress 80.0%"
    assert view.failed_nodes == [nodes[3]]
    assert report(plane, tasks[nodes[4]], "Succeeded", seq=1).applied
    view = view_job(plane.store, "default", "warm", now=plane.now())
    assert view.message == "job has completed" and view.completion_time is not None
    assert counters(plane) == (5, 0, 4, 1)
    assert_invariant(plane)


def test_same_spec_twice_is_unchanged_and_sends_nothing_new(plane: ControlPlane) -> None:
    nodes = cluster_of(plane, 2)
    doc = job_doc(parallelism=2)
    apply_manifest(plane.store, doc, now=plane.now())
    plan(plane)
    assert len(tasks_sent(plane, nodes)) == 2
    assert apply_manifest(plane.store, doc, now=plane.now()).outcome == "unchanged"
    record = plane.store.get_job("default/warm")
    assert record is not None
    assert not record.needs_planning()  # the stream record of this write is skipped by dispatch_job
    assert tasks_sent(plane, nodes) == {}


def test_parallelism_two_never_has_more_than_two_active(plane: ControlPlane) -> None:
    nodes = cluster_of(plane, 10)
    apply_manifest(plane.store, job_doc(parallelism=2), now=plane.now())
    plan(plane)
    done = 0
    while done < 10:
        sent = tasks_sent(plane, nodes)
        assert 1 <= sum(len(m) for m in sent.values()) <= 2
        assert plane.store.get_job("default/warm").counters.active <= 2  # type: ignore[union-attr]
        for msgs in sent.values():
            report(plane, msgs[0], "Pulling")
            assert plane.store.get_job("default/warm").counters.active <= 2  # type: ignore[union-attr]
            report(plane, msgs[0], "Succeeded", seq=1)
            done += 1
    assert counters(plane) == (10, 0, 10, 0)
    assert_invariant(plane)


def test_parallelism_zero_pauses_until_changed(plane: ControlPlane) -> None:
    nodes = cluster_of(plane, 3)
    apply_manifest(plane.store, job_doc(parallelism=0), now=plane.now())
    plan(plane)
    assert tasks_sent(plane, nodes) == {}
    assert counters(plane) == (3, 0, 0, 0)
    assert apply_manifest(plane.store, job_doc(parallelism=3), now=plane.now()).outcome == "configured"
    plan(plane)
    assert sorted(tasks_sent(plane, nodes)) == nodes


def test_duplicate_and_reordered_reports_count_once(plane: ControlPlane) -> None:
    nodes = cluster_of(plane, 2)
    apply_manifest(plane.store, job_doc(parallelism=2), now=plane.now())
    plan(plane)
    tasks = {n: m[0] for n, m in tasks_sent(plane, nodes).items()}
    t = tasks[nodes[0]]
    assert report(plane, t, "Succeeded", seq=3).applied
    assert not report(plane, t, "Pulling", seq=1).applied  # late progress never moves it back
    assert not report(plane, t, "Succeeded", seq=3).applied  # duplicate
    assert counters(plane) == (2, 1, 1, 0)
    assert_invariant(plane)


def test_pulling_progress_updates_bytes_and_keeps_counters(plane: ControlPlane) -> None:
    nodes = cluster_of(plane, 1)
    apply_manifest(plane.store, job_doc(), now=plane.now())
    plan(plane)
    task = tasks_sent(plane, nodes)[nodes[0]][0]
    report(plane, task, "Pulling", seq=1, bytes_done=10, bytes_total=100)
    report(plane, task, "Pulling", seq=2, bytes_done=60, bytes_total=100)
    assert not report(plane, task, "Pulling", seq=1, bytes_done=10, bytes_total=100).applied
    stored = plane.store.get_task("default/warm", nodes[0])
    assert stored is not None and stored.bytes_done == 60
    assert counters(plane) == (1, 1, 0, 0)


def test_crash_after_report_transaction_converges_on_redelivery(plane: ControlPlane, monkeypatch: Any) -> None:
    nodes = cluster_of(plane, 3)
    apply_manifest(plane.store, job_doc(parallelism=1), now=plane.now())
    plan(plane)
    first = next(iter(tasks_sent(plane, nodes).values()))[0]
    import prewarm.services.reports as reports

    real_fill = reports.fill_slots
    monkeypatch.setattr(reports, "fill_slots", lambda *a, **k: (_ for _ in ()).throw(RuntimeError("crash")))
    with pytest.raises(RuntimeError):
        report(plane, first, "Succeeded", seq=1)
    assert tasks_sent(plane, nodes) == {}  # the freed slot was not handed on: the crash hit first
    monkeypatch.setattr(reports, "fill_slots", real_fill)
    assert not report(plane, first, "Succeeded", seq=1).applied  # SQS redelivers the same message
    assert len(tasks_sent(plane, nodes)) == 1  # ...and the retry hands the slot on
    assert counters(plane) == (3, 1, 1, 0)
    assert_invariant(plane)


def test_crash_between_plan_commit_and_send_resends_on_retry(plane: ControlPlane, monkeypatch: Any) -> None:
    nodes = cluster_of(plane, 2)
    apply_manifest(plane.store, job_doc(parallelism=2), now=plane.now())

    def failing(messages: Any) -> Any:
        raise RuntimeError("crash before send")

    monkeypatch.setattr(plane.queues, "send_many", failing)
    with pytest.raises(RuntimeError):
        plan(plane)
    monkeypatch.undo()
    plan(plane)  # the stream retries the record
    assert sorted(tasks_sent(plane, nodes)) == nodes
    assert counters(plane) == (2, 2, 0, 0)
    assert_invariant(plane)


def test_deadline_expiring_mid_job_fails_it_and_cancels_in_flight(plane: ControlPlane) -> None:
    nodes = cluster_of(plane, 3)
    spec = {"parallelism": 1, "completionPolicy": {"type": "Always", "activeDeadlineSeconds": 600},
            "pullPolicy": {"timeoutSeconds": 300}}
    apply_manifest(plane.store, job_doc(**spec), now=plane.now())
    plan(plane)
    task = next(iter(tasks_sent(plane, nodes).values()))[0]
    report(plane, task, "Pulling")
    result = sweep(plane.store, plane.queues, clusters_of(plane.store), now=plane.now() + 700,
                   config=SweepSettings(prefix="pw"))
    assert result.deadline_failed == ["default/warm"]
    cancels = tasks_sent(plane, nodes)
    assert list(cancels) == [task.node] and isinstance(cancels[task.node][0], CancelTask)
    view = view_job(plane.store, "default", "warm", now=plane.now())
    assert view.message == DEADLINE_EXCEEDED_MESSAGE
    assert (view.desired, view.active, view.succeeded, view.failed) == (3, 0, 0, 3)
    assert not report(plane, task, "Succeeded", seq=1).applied
    assert_invariant(plane)


def test_a_task_sent_and_never_reported_is_failed_after_timeout_plus_grace(plane: ControlPlane) -> None:
    # Its agent may hold it until a pull slot frees. A silent Pulling node: tests/unit/services/test_liveness.py
    nodes = cluster_of(plane, 1)
    apply_manifest(plane.store, job_doc(pullPolicy={"timeoutSeconds": 60}), now=plane.now())
    plan(plane)
    tasks_sent(plane, nodes)
    assert sweep(plane.store, plane.queues, clusters_of(plane.store), now=plane.now() + 60 + 299,
                 config=SweepSettings(prefix="pw")).silent_nodes == []
    result = sweep(plane.store, plane.queues, clusters_of(plane.store), now=plane.now() + 60 + 301,
                   config=SweepSettings(prefix="pw"))
    assert result.silent_nodes == [f"default/warm:{nodes[0]}"]
    view = view_job(plane.store, "default", "warm", now=plane.now())
    assert view.failed_nodes == nodes and view.message == "job has completed"
    stored = plane.store.get_task("default/warm", nodes[0])
    assert stored is not None and stored.message == SILENT_NODE_MESSAGE


def test_never_job_daily_round_ignores_old_round_reports(plane: ControlPlane) -> None:
    nodes = cluster_of(plane, 2)
    apply_manifest(plane.store, job_doc(parallelism=2, completionPolicy={"type": "Never"}), now=plane.now())
    plan(plane)
    old = {n: m[0] for n, m in tasks_sent(plane, nodes).items()}
    for t in old.values():
        report(plane, t, "Succeeded", seq=1)
    assert view_job(plane.store, "default", "warm", now=plane.now()).completion_time is None  # Never never completes
    assert repull_daily(plane.store) == ["default/warm"]
    plan(plane)
    new = {n: m[0] for n, m in tasks_sent(plane, nodes).items()}
    assert {t.round for t in new.values()} == {1}
    assert counters(plane) == (2, 2, 0, 0)
    assert not report(plane, old[nodes[0]], "Succeeded", seq=5).applied
    assert report(plane, new[nodes[0]], "Succeeded", seq=1).applied
    assert counters(plane) == (2, 1, 1, 0)
    assert_invariant(plane)


def test_new_node_hello_joins_active_never_jobs_at_once(plane: ControlPlane) -> None:
    nodes = cluster_of(plane, 1)
    apply_manifest(plane.store, job_doc(parallelism=5, completionPolicy={"type": "Never"},
                                        selector={"matchLabels": {"pool": "gpu"}}), now=plane.now())
    apply_manifest(plane.store, job_doc("always-job", selector={"matchLabels": {"pool": "gpu"}}), now=plane.now())
    plan(plane)
    plan(plane, "always-job")
    tasks_sent(plane, nodes)
    plane.cluster.nodes.append(make_node("node-new", pool="gpu"))
    plane.queues.ensure_queue("node-new")  # its agent's queue, before its hello
    outcome = register_node(plane.store, plane.queues, plane.cluster,
                            Hello(node="node-new", labels={"pool": "gpu"}, architecture="amd64"), now=plane.now())
    assert outcome.added_to == ["default/warm"]
    sent = tasks_sent(plane, ["node-new"])["node-new"]
    assert [m.job for m in sent] == ["default/warm"]
    assert counters(plane) == (2, 2, 0, 0)
    assert_invariant(plane)
    again = register_node(plane.store, plane.queues, plane.cluster,
                          Hello(node="node-new", labels={"pool": "gpu"}), now=plane.now())
    assert again.added_to == []


def test_deleting_a_running_job_cancels_and_later_reports_count_nothing(plane: ControlPlane) -> None:
    nodes = cluster_of(plane, 2)
    apply_manifest(plane.store, job_doc(parallelism=2), now=plane.now())
    plan(plane)
    tasks = {n: m[0] for n, m in tasks_sent(plane, nodes).items()}
    report(plane, tasks[nodes[0]], "Pulling")
    assert delete_job(plane.store, plane.queues, "default", "warm") == 2
    cancels = tasks_sent(plane, nodes)
    assert all(isinstance(m[0], CancelTask) for m in cancels.values()) and sorted(cancels) == nodes
    assert not report(plane, tasks[nodes[0]], "Succeeded", seq=1).applied
    assert plane.store.get_job("default/warm") is None
    assert plane.store.get_tasks("default/warm") == []


def test_editing_the_selector_adds_new_nodes_and_cancels_dropped_ones(plane: ControlPlane) -> None:
    gpu = cluster_of(plane, 2)
    plane.cluster.nodes += [make_node("cpu-0", pool="cpu")]
    apply_manifest(plane.store, job_doc(parallelism=3, selector={"matchLabels": {"pool": "gpu"}}), now=plane.now())
    plan(plane)
    tasks = {n: m[0] for n, m in tasks_sent(plane, [*gpu, "cpu-0"]).items()}
    report(plane, tasks[gpu[0]], "Succeeded", seq=1)
    edited = job_doc(parallelism=3, selector={"names": [gpu[0], "cpu-0"]})
    assert apply_manifest(plane.store, edited, now=plane.now()).outcome == "configured"
    result = plan(plane)
    assert result.added == ["cpu-0"] and result.removed == [gpu[1]]
    sent = tasks_sent(plane, [*gpu, "cpu-0"])
    assert isinstance(sent[gpu[1]][0], CancelTask)
    assert isinstance(sent["cpu-0"][0], PullTask)
    assert counters(plane) == (2, 1, 1, 0)
    assert_invariant(plane)


def test_pod_selector_targets_nodes_of_active_scheduled_pods(plane: ControlPlane) -> None:
    nodes = cluster_of(plane, 4)
    plane.cluster.pods += [
        make_pod("a", "default", nodes[0], app="llm"),
        make_pod("b", "default", nodes[0], app="llm"),
        make_pod("c", "default", nodes[1], app="llm"),
        make_pod("d", "default", nodes[2], phase="Succeeded", app="llm"),
        make_pod("e", "default", None, phase="Pending", app="llm"),
    ]
    apply_manifest(plane.store, job_doc(parallelism=5, podSelector={"matchLabels": {"app": "llm"}}), now=plane.now())
    plan(plane)
    assert sorted(tasks_sent(plane, nodes)) == nodes[:2]


def test_index_platforms_skip_nodes_of_missing_architectures(plane: ControlPlane) -> None:
    amd = cluster_of(plane, 2)
    plane.cluster.nodes.append(make_node("arm-0", arch="arm64", pool="gpu"))
    from prewarm.domain.jobs import ImagePullJob
    from prewarm.services.jobs import apply_job

    job = ImagePullJob.from_manifest(job_doc(parallelism=5))
    apply_job(plane.store, job, now=plane.now(), platforms=[{"os": "linux", "architecture": "amd64"}])
    plan(plane)
    assert sorted(tasks_sent(plane, [*amd, "arm-0"])) == amd
    record = plane.store.get_job("default/warm")
    assert record is not None and [e.name for e in plane.store.get_excluded(record.key)] == ["arm-0"]


def test_not_ready_and_virtual_kubelet_nodes_are_excluded_with_reasons(plane: ControlPlane) -> None:
    cluster_of(plane, 1)
    plane.cluster.nodes += [make_node("sick", ready=False), make_node("fargate", type="virtual-kubelet")]
    apply_manifest(plane.store, job_doc(parallelism=5), now=plane.now())
    plan(plane)
    record = plane.store.get_job("default/warm")
    assert record is not None
    assert {e.name: e.reason for e in plane.store.get_excluded(record.key)} == {
        "sick": "node is not Ready", "fargate": "virtual-kubelet node"}


def test_job_with_no_eligible_nodes_completes_at_once(plane: ControlPlane) -> None:
    apply_manifest(plane.store, job_doc(selector={"names": ["ghost"]}), now=plane.now())
    plan(plane)
    view = view_job(plane.store, "default", "warm", now=plane.now())
    # The node asked for by name is not skipped in silence: the message says why it was left out
    assert view.desired == 0 and view.message == "job has completed; named node ghost excluded: node not found"


def test_ttl_after_finished_deletes_in_sweep(plane: ControlPlane) -> None:
    nodes = cluster_of(plane, 1)
    apply_manifest(plane.store, job_doc(completionPolicy={"type": "Always", "ttlSecondsAfterFinished": 60}),
                   now=plane.now())
    plan(plane)
    report(plane, tasks_sent(plane, nodes)[nodes[0]][0], "Succeeded", seq=1)
    record = plane.store.get_job("default/warm")
    assert record is not None and record.ttl is not None
    # moto never deletes by TTL (nor does DynamoDB promptly): sweep does.
    assert sweep(plane.store, plane.queues, clusters_of(plane.store), now=record.ttl + 1,
                 config=SweepSettings(prefix="pw")).expired == ["default/warm"]
    assert plane.store.get_job("default/warm") is None


def test_sweep_deletes_queues_of_departed_nodes_only_its_own(plane: ControlPlane) -> None:
    nodes = cluster_of(plane, 2)
    for n in nodes:
        plane.queues.ensure_queue(n)
    plane.sqs.create_queue("pw-other-stack-queue")
    plane.cluster.nodes = plane.cluster.nodes[:1]
    result = sweep(plane.store, plane.queues, clusters_of(plane.store, plane.cluster), now=plane.now(),
                   config=SweepSettings(prefix="pw"))
    assert result.queues_deleted == [plane.queues.queue_name(nodes[1])]
    left = plane.queues.list_node_queues()
    assert plane.queues.queue_name(nodes[0]) in left and "pw-other-stack-queue" in left


def test_editing_a_finished_job_runs_it_again_with_its_completion_cleared(plane: ControlPlane) -> None:
    nodes = cluster_of(plane, 2)
    plane.cluster.nodes.append(make_node("extra", pool="cpu"))
    ttl = {"type": "Always", "ttlSecondsAfterFinished": 600}
    apply_manifest(plane.store, job_doc(parallelism=2, selector={"matchLabels": {"pool": "gpu"}},
                                        completionPolicy=ttl), now=plane.now())
    plan(plane)
    for task in (m[0] for m in tasks_sent(plane, nodes).values()):
        report(plane, task, "Succeeded", seq=1)
    assert view_job(plane.store, "default", "warm", now=plane.now()).message == "job has completed"
    edited = job_doc(parallelism=2, selector={"names": [*nodes, "extra"]}, completionPolicy=ttl)
    assert apply_manifest(plane.store, edited, now=plane.now()).outcome == "configured"
    record = plane.store.get_job("default/warm")
    assert record is not None and record.state == "Running"
    assert (record.completion_time, record.ttl, record.message) == (None, None, "")
    plan(plane)
    (task,) = tasks_sent(plane, [*nodes, "extra"])["extra"]
    assert view_job(plane.store, "default", "warm", now=plane.now()).completion_time is None
    report(plane, task, "Succeeded", seq=1)
    assert counters(plane) == (3, 0, 3, 0)
    assert view_job(plane.store, "default", "warm", now=plane.now()).message == "job has completed"
    assert_invariant(plane)


def test_reapplying_a_job_that_was_never_planned_retriggers_its_plan(plane: ControlPlane) -> None:
    apply_manifest(plane.store, job_doc(), now=plane.now())
    assert apply_manifest(plane.store, job_doc(), now=plane.now()).outcome == "unchanged"  # the stream is on it
    # Minutes later it is still unplanned: its stream record went to the DLQ. Applying the same spec
    # again must not be a no-op then, or the job could only be recovered by deleting it.
    assert apply_manifest(plane.store, job_doc(), now=plane.now() + 600).outcome == "configured"
    record = plane.store.get_job("default/warm")
    assert record is not None and record.generation == 2 and record.planned != record.plan_id
    plan(plane)
    record = plane.store.get_job("default/warm")
    assert record is not None and record.planned == record.plan_id
    assert apply_manifest(plane.store, job_doc(), now=plane.now()).outcome == "unchanged"


def test_image_list_job_dropping_an_image_cancels_its_pulls_and_finishes_with_a_ttl(plane: ControlPlane) -> None:
    nodes = cluster_of(plane, 1)
    other = "123456789012.dkr.ecr.us-west-2.amazonaws.com/ml/tok@sha256:" + "b" * 64
    doc = {"apiVersion": "apps.kruise.io/v1alpha1", "kind": "ImageListPullJob",
           "metadata": {"name": "bundle", "namespace": "default"},
           "spec": {"images": [IMAGE, other], "completionPolicy": {"type": "Always", "ttlSecondsAfterFinished": 60}}}
    apply_manifest(plane.store, doc, now=plane.now())
    record = plane.store.get_job("default/bundle")
    assert record is not None
    for child in record.children:
        plan(plane, child)
    sent = tasks_sent(plane, nodes)[nodes[0]]
    assert len(sent) == 2
    doc["spec"]["images"] = [IMAGE]
    assert apply_manifest(plane.store, doc, now=plane.now()).outcome == "configured"
    # The apply (the CLI) sends nothing: it marks the dropped image's job Deleting ...
    assert not tasks_sent(plane, nodes).get(nodes[0])
    deleting = [r.key for r in plane.store.list_jobs() if r.state == "Deleting"]
    assert len(deleting) == 1
    # ... and the table stream hands that record to dispatch_job, which cancels its pulls
    assert complete_deletion(plane.store, plane.queues, deleting[0]) == 1
    (cancel,) = tasks_sent(plane, nodes)[nodes[0]]
    assert isinstance(cancel, CancelTask) and cancel.reason == "job deleted"
    kept = next(t for t in sent if t.image == IMAGE)
    report(plane, kept, "Succeeded", seq=1)
    sweep(plane.store, plane.queues, clusters_of(plane.store), now=plane.now(), config=SweepSettings(prefix="pw"))
    record = plane.store.get_job("default/bundle")
    assert record is not None and record.state == "Completed" and record.ttl is not None
    sweep(plane.store, plane.queues, clusters_of(plane.store), now=record.ttl + 1, config=SweepSettings(prefix="pw"))
    assert plane.store.get_job("default/bundle") is None


def test_a_missing_pull_secret_fails_the_job_and_its_ttl_still_applies(plane: ControlPlane) -> None:
    cluster_of(plane, 1)
    apply_manifest(plane.store, job_doc(pullSecrets=["regcred"], completionPolicy={
        "type": "Always", "ttlSecondsAfterFinished": 30}), now=plane.now())
    result = plan(plane)
    assert result.action.startswith("failed: ")
    record = plane.store.get_job("default/warm")
    assert record is not None and record.state == "Failed" and record.ttl is not None


def test_a_claim_refused_after_others_succeeded_leaves_no_claimed_node_without_its_task(
    plane: ControlPlane, monkeypatch: Any
) -> None:
    # Given a planned job using its 3 slots with 5 nodes waiting, whose claims go 1 at a time
    import prewarm.services.dispatch as dispatch
    from prewarm.services.ports import StoreRetryableError
    from prewarm.services.status_batches import record_status

    nodes = cluster_of(plane, 8)
    apply_manifest(plane.store, job_doc(parallelism=3), now=plane.now())
    plan(plane)
    first_wave = [messages[0] for messages in tasks_sent(plane, nodes).values()]
    assert len(first_wave) == 3
    monkeypatch.setattr(dispatch, "MAX_CLAIMS_PER_TRANSACTION", 1)
    real_claim = plane.store.claim_tasks
    calls = {"n": 0}

    def claim_then_conflict(*args: Any, **kwargs: Any) -> Any:
        calls["n"] += 1
        if calls["n"] == 2:  # the second claim meets another batch's transaction on the job item
            raise StoreRetryableError("claim 1 nodes: transaction throttled or in conflict (TransactionConflict)")
        return real_claim(*args, **kwargs)

    monkeypatch.setattr(plane.store, "claim_tasks", claim_then_conflict)

    # When one batch brings two Succeeded reports (two slots free) and the refill's second claim is refused
    done = [StatusReport(job=t.job, job_uid=t.job_uid, round=t.round, node=t.node, phase="Succeeded", seq=1)
            for t in first_wave[:2]]
    # (if it raises, the batch goes back to the queue; what matters is what was claimed before)
    with contextlib.suppress(StoreRetryableError):
        record_status(plane.store, plane.queues, clusters_of(plane.store),
                      [(f"m{i}", r) for i, r in enumerate(done)], now=plane.now())

    # Then the node the first claim took already has its task: no node is dispatched with no task sent
    assert calls["n"] >= 2
    sent = tasks_sent(plane, nodes)
    wave = {t.node for t in first_wave}
    refilled = sorted(t.node for t in plane.store.get_tasks("default/warm")
                      if t.dispatched_at is not None and t.phase.value == "Waiting" and t.node not in wave)
    assert refilled and sorted(sent) == refilled


def _two_slots_freed_without_refill(plane: ControlPlane, monkeypatch: Any) -> list[str]:
    """A job of parallelism 3 over 8 nodes whose first two pulls succeeded with no refill yet."""
    import prewarm.services.reports as reports

    nodes = cluster_of(plane, 8)
    apply_manifest(plane.store, job_doc(parallelism=3), now=plane.now())
    plan(plane)
    first_wave = [messages[0] for messages in tasks_sent(plane, nodes).values()]
    monkeypatch.setattr(reports, "fill_slots", lambda *a, **k: None)
    for task in first_wave[:2]:
        assert report(plane, task, "Succeeded", seq=1).applied
    monkeypatch.undo()
    assert counters(plane) == (8, 1, 2, 0)
    return nodes


def test_a_claim_refused_by_another_fillers_transaction_is_tried_again_after_a_jittered_backoff(
    plane: ControlPlane, monkeypatch: Any
) -> None:
    # Given two free slots, and claims that meet another batch's transaction twice before going through
    import random

    from prewarm.services.dispatch import fill_slots
    from prewarm.services.ports import StoreRetryableError

    nodes = _two_slots_freed_without_refill(plane, monkeypatch)
    real_claim = plane.store.claim_tasks
    calls = {"n": 0}

    def conflict_twice(*args: Any, **kwargs: Any) -> Any:
        calls["n"] += 1
        if calls["n"] <= 2:
            raise StoreRetryableError("claim 2 nodes: transaction throttled or in conflict (TransactionConflict)")
        return real_claim(*args, **kwargs)

    monkeypatch.setattr(plane.store, "claim_tasks", conflict_twice)
    slept: list[float] = []

    # When the freed slots are refilled
    result = fill_slots(plane.store, plane.queues, "default/warm", now=plane.now(), sleep=slept.append,
                        rng=random.Random(7))

    # Then both slots are filled on the third claim, after two backoffs within their doubling bounds
    assert calls["n"] == 3 and len(result.claimed) == 2 and result.sent == 2
    assert len(slept) == 2 and 0 <= slept[0] <= 0.1 and 0 <= slept[1] <= 0.2
    assert counters(plane) == (8, 3, 2, 0)
    assert sorted(tasks_sent(plane, nodes)) == sorted(result.claimed)
    assert_invariant(plane)


def test_claims_refused_every_time_raise_for_the_batch_to_come_again_and_claim_nothing(
    plane: ControlPlane, monkeypatch: Any
) -> None:
    # Given two free slots, and a job item that another batch's transactions hold at every try
    from prewarm.services.dispatch import CLAIM_ATTEMPTS, fill_slots
    from prewarm.services.ports import StoreRetryableError

    nodes = _two_slots_freed_without_refill(plane, monkeypatch)

    def always_conflict(*args: Any, **kwargs: Any) -> Any:
        raise StoreRetryableError("claim 2 nodes: transaction throttled or in conflict (TransactionConflict)")

    monkeypatch.setattr(plane.store, "claim_tasks", always_conflict)
    slept: list[float] = []

    # When the freed slots are refilled
    with pytest.raises(StoreRetryableError, match="TransactionConflict"):
        fill_slots(plane.store, plane.queues, "default/warm", now=plane.now(), sleep=slept.append)

    # Then it gave up after CLAIM_ATTEMPTS refusals, backing off between them, with nothing claimed or sent
    assert len(slept) == CLAIM_ATTEMPTS - 1 and max(slept) <= 2.0
    assert tasks_sent(plane, nodes) == {} and counters(plane) == (8, 1, 2, 0)


def test_waiting_nodes_are_read_from_the_start_shard_on_then_round_the_others(plane: ControlPlane) -> None:
    # Given a job's waiting nodes spread over three shards
    from prewarm.domain.status import NodeTaskRecord
    from tests.support.memory_store import shard_of

    names = [f"node-{i:02d}" for i in range(30)]
    plane.store.put_tasks("default/spread", [NodeTaskRecord(node=n, round=0) for n in names], shards=3)
    by_shard = {s: sorted(n for n in names if shard_of(n, 3) == s) for s in range(3)}
    assert all(by_shard.values())

    for start in range(4):
        # When a filler reads a few of them from a given shard first
        first = plane.store.waiting_nodes("default/spread", limit=len(by_shard[start % 3]), shards=3, start=start)
        # Then they are that shard's (the start wraps round the shards)
        assert sorted(first) == by_shard[start % 3]
        # And asking for all of them from any shard finds every waiting node once
        assert sorted(plane.store.waiting_nodes("default/spread", limit=40, shards=3, start=start)) == names


def test_a_hello_stores_the_agents_version_and_a_later_hello_replaces_it(plane: ControlPlane) -> None:
    register_node(plane.store, plane.queues, None, Hello(node="n-v", agent_version="0.1.0"), now=plane.now())
    node = plane.store.get_node("n-v")
    assert node is not None and node.agent_version == "0.1.0"
    register_node(plane.store, plane.queues, None, Hello(node="n-v", agent_version="0.2.0"), now=plane.now())
    node = plane.store.get_node("n-v")
    assert node is not None and node.agent_version == "0.2.0"
    register_node(plane.store, plane.queues, None, Hello(node="n-v"), now=plane.now())
    node = plane.store.get_node("n-v")
    assert node is not None and node.agent_version == ""  # an agent too old to say


def test_a_never_plan_asks_its_caller_to_tell_warming_nodes_and_an_always_plan_does_not(
    plane: ControlPlane,
) -> None:
    cluster_of(plane, 1)
    apply_manifest(plane.store, job_doc("never", completionPolicy={"type": "Never"}), now=plane.now())
    apply_manifest(plane.store, job_doc("always"), now=plane.now())
    never = plan_job(plane.store, plane.cluster, plane.queues, "default/never", now=plane.now())
    always = plan_job(plane.store, plane.cluster, plane.queues, "default/always", now=plane.now())
    assert (never.changes_warming, always.changes_warming) == (True, False)
    # A retry of a planned Never job asks again: its lists may not all have gone out
    again = plan_job(plane.store, plane.cluster, plane.queues, "default/never", now=plane.now())
    assert (again.action, again.changes_warming) == ("already planned", True)


def test_a_progress_write_refused_by_a_transaction_in_flight_is_applied_on_the_next_attempt(
    plane: ControlPlane, monkeypatch: Any
) -> None:
    # Given a node pulling, whose progress write first meets another batch's transaction on its item
    # (DynamoDB's TransactionConflictException on a single UpdateItem: retryable since this change)
    from prewarm.services.ports import StoreRetryableError
    from prewarm.services.reports import record_reports

    nodes = cluster_of(plane, 1)
    apply_manifest(plane.store, job_doc(parallelism=1), now=plane.now())
    plan(plane)
    (task,) = [messages[0] for messages in tasks_sent(plane, nodes).values()]
    assert report(plane, task, "Pulling", seq=1).applied
    real_update = plane.store.update_task
    refused = {"n": 0}

    def conflict_once(*args: Any, **kwargs: Any) -> None:
        if refused["n"] == 0:
            refused["n"] += 1
            raise StoreRetryableError("record node: TransactionConflictException")
        real_update(*args, **kwargs)

    monkeypatch.setattr(plane.store, "update_task", conflict_once)
    slept: list[float] = []
    progress = StatusReport(job=task.job, job_uid=task.job_uid, round=task.round, node=task.node, phase="Pulling",
                            seq=2, bytes_done=5, bytes_total=10)
    # When the batch with its progress report is applied
    outcome = record_reports(plane.store, plane.queues, [progress], now=plane.now(), sleep=slept.append).outcomes[0]
    # Then it is written on the next attempt, after one backoff (a jittered draw below 50 ms), and nothing goes
    # back to the queue
    assert (outcome.applied, outcome.retry, refused["n"], len(slept)) == (True, False, 1, 1)
    assert 0 <= slept[0] <= 0.05
    stored = plane.store.get_task(task.job, task.node)
    assert stored is not None and stored.bytes_done == 5
