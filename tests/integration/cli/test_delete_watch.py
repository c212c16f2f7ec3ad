"""`prewarm delete` (cancels reach the node queues) and `prewarm watch` (progress and exit codes)."""

from __future__ import annotations

import textwrap
import threading
import time

import pytest

from prewarm.domain.jobs import job_key
from prewarm.domain.messages import CancelTask, PullTask
from tests.support.cli import Run
from tests.support.control_plane import ControlPlane
from tests.support.manifests import job_yaml

pytestmark = pytest.mark.integration

MIB = 2**20
RULE = textwrap.dedent("""\
    apiVersion: prewarm.dev/v1alpha1
    kind: PrewarmRule
    metadata: {name: delete-rule}
    spec: {repositories: [web]}
    """)


def test_deleting_a_job_cancels_its_in_flight_pulls_on_their_node_queues(
    prewarm: Run, control_plane: ControlPlane
) -> None:
    # Given a job on three nodes with two tasks sent, one of them already pulling
    assert prewarm("apply", "-f", "-", input=job_yaml("delete-web", parallelism=2)).exit_code == 0
    control_plane.plan("delete-web")
    sent = {node: control_plane.node_messages(node) for node in ("node-a", "node-b", "node-c")}
    assert [type(m) for m in sent["node-a"] + sent["node-b"]] == [PullTask, PullTask] and not sent["node-c"]
    control_plane.report("delete-web", "node-a", "Pulling", bytes_done=MIB, bytes_total=8 * MIB)

    # When it is deleted
    result = prewarm("delete", "job", "delete-web")

    # Then kubectl's answer says how many pulls are being cancelled, and the CLI itself sent nothing:
    # node queues take messages from the stack's roles only
    assert result.exit_code == 0, result.stderr
    assert result.stdout == 'imagepulljob.apps.kruise.io "delete-web" deleted (2 in-flight pulls being cancelled)\n'
    assert all(control_plane.node_messages(n) == [] for n in ("node-a", "node-b", "node-c"))
    # And once the control plane has the job's Deleting record, the cancels are on those nodes' queues
    # and the job is gone
    assert control_plane.finish_deletions() == ["default/delete-web"]
    for node in ("node-a", "node-b"):
        (cancel,) = control_plane.node_messages(node)
        assert isinstance(cancel, CancelTask)
        assert (cancel.job, cancel.node, cancel.reason) == ("default/delete-web", node, "job deleted")
    assert control_plane.node_messages("node-c") == []
    assert control_plane.store.get_job(job_key("default", "delete-web")) is None


def test_deleting_a_list_job_removes_its_image_pull_jobs(prewarm: Run, control_plane: ControlPlane) -> None:
    # Given a list job of two images
    manifest = "apiVersion: apps.kruise.io/v1alpha1\nkind: ImageListPullJob\nmetadata: {name: delete-list}\n" \
               "spec: {images: [redis:7, memcached:1.6]}\n"
    assert prewarm("apply", "-f", "-", input=manifest).exit_code == 0
    record = control_plane.store.get_job(job_key("default", "delete-list"))
    assert record is not None and len(record.children) == 2

    # When it is deleted
    result = prewarm("delete", "job", "delete-list")

    # Then it and its children are gone once the control plane has their Deleting records
    assert result.stdout == 'imagelistpulljob.apps.kruise.io "delete-list" deleted\n'
    assert sorted(control_plane.finish_deletions()) == sorted(
        [job_key("default", c) for c in record.children] + [job_key("default", "delete-list")])
    assert all(control_plane.store.get_job(job_key("default", c)) is None for c in record.children)
    assert control_plane.store.get_job(job_key("default", "delete-list")) is None


def test_deleting_a_missing_job_exits_1_and_still_deletes_the_others(prewarm: Run) -> None:
    # Given one existing job
    assert prewarm("apply", "-f", "-", input=job_yaml("delete-keep")).exit_code == 0

    # When it and a missing one are deleted
    result = prewarm("delete", "job", "x", "delete-keep")

    # Then the missing one is named on stderr, the other deleted, and the exit code is 1
    assert result.exit_code == 1
    assert result.stderr == 'error: job "x" not found in namespace "default"\n'
    assert result.stdout == 'imagepulljob.apps.kruise.io "delete-keep" deleted\n'


def test_deleting_a_rule_and_then_a_missing_rule(prewarm: Run) -> None:
    # Given a rule
    assert prewarm("apply", "-f", "-", input=RULE).exit_code == 0

    # When it is deleted twice
    first = prewarm("delete", "rule", "delete-rule")
    second = prewarm("delete", "rule", "delete-rule")

    # Then the first deletes it, the second fails naming it
    assert (first.exit_code, first.stdout) == (0, 'prewarmrule.prewarm.dev "delete-rule" deleted\n')
    assert (second.exit_code, second.stderr) == (1, 'error: rule "delete-rule" not found\n')


def test_deleting_a_warm_snapshot_and_then_a_missing_one(prewarm: Run) -> None:
    # Given a warm snapshot applied with the CLI (rules only: nothing baked yet, so nothing to turn off)
    snapshot = textwrap.dedent("""\
        apiVersion: prewarm.dev/v1alpha1
        kind: WarmSnapshot
        metadata: {name: delete-gpu}
        spec:
          nodeClass: {ec2NodeClass: gpu}
          amiFamily: Bottlerocket
          rules: [delete-rule]
          builder: {subnetIds: [subnet-0123456789abcdef0]}
        """)
    applied = prewarm("apply", "-f", "-", input=snapshot)
    assert applied.exit_code == 0, applied.stderr

    # When it is deleted twice, Then the first deletes it at once, the second fails naming it
    first = prewarm("delete", "snapshot", "delete-gpu")
    second = prewarm("delete", "warmsnapshot", "delete-gpu")
    assert (first.exit_code, first.stdout) == (0, 'warmsnapshot.prewarm.dev "delete-gpu" deleted\n'), first.stderr
    assert (second.exit_code, second.stderr) == (1, 'error: warm snapshot "delete-gpu" not found\n')


def _watch(prewarm: Run, name: str, *extra: str) -> tuple[int, list[str], str]:
    result = prewarm("watch", "job", name, "--interval", "0.1", "--timeout", "10", *extra)
    return result.exit_code, result.stdout.splitlines(), result.stderr


def test_watch_exits_0_when_every_node_succeeded(prewarm: Run, control_plane: ControlPlane) -> None:
    # Given a job whose two nodes both pulled the image
    assert prewarm("apply", "-f", "-", input=job_yaml("watch-ok", nodes=("node-a", "node-b"))).exit_code == 0
    control_plane.plan("watch-ok")
    for node in ("node-a", "node-b"):
        control_plane.report("watch-ok", node, "Succeeded", bytes_done=4 * MIB, bytes_total=4 * MIB)

    # When it is watched
    code, lines, stderr = _watch(prewarm, "watch-ok")

    # Then the progress and the outcome are printed and the exit code is 0
    assert (code, stderr) == (0, "")
    assert lines[0] == "ImagePullJob default/watch-ok: 2/2 nodes done (2 succeeded, 0 failed, 0 active, 0 waiting), " \
                       "8.0 MiB of 8.0 MiB"
    assert lines[-1] == "ImagePullJob default/watch-ok completed: 2/2 nodes succeeded"


def test_watch_exits_1_when_a_node_failed(prewarm: Run, control_plane: ControlPlane) -> None:
    # Given a finished job with one failed node
    assert prewarm("apply", "-f", "-", input=job_yaml("watch-fail", nodes=("node-a", "node-b"))).exit_code == 0
    control_plane.plan("watch-fail")
    control_plane.report("watch-fail", "node-a", "Succeeded")
    control_plane.report("watch-fail", "node-b", "Failed", message="manifest unknown")

    # When it is watched
    code, lines, _ = _watch(prewarm, "watch-fail")

    # Then the failed node is named and the exit code is 1
    assert code == 1
    assert lines[-1] == "ImagePullJob default/watch-fail completed: 1 of 2 nodes failed: node-b"


def test_watch_follows_reports_as_they_arrive(prewarm: Run, control_plane: ControlPlane) -> None:
    # Given a planned job whose nodes report while it is watched
    assert prewarm("apply", "-f", "-", input=job_yaml("watch-live", nodes=("node-a", "node-b"))).exit_code == 0
    control_plane.plan("watch-live")

    def agents() -> None:
        time.sleep(0.3)
        control_plane.report("watch-live", "node-a", "Pulling", bytes_done=MIB, bytes_total=2 * MIB)
        time.sleep(0.3)
        control_plane.report("watch-live", "node-a", "Succeeded", bytes_done=2 * MIB, bytes_total=2 * MIB)
        control_plane.report("watch-live", "node-b", "Succeeded", bytes_done=2 * MIB, bytes_total=2 * MIB)

    reporter = threading.Thread(target=agents)
    reporter.start()
    try:
        # When it is watched
        code, lines, _ = _watch(prewarm, "watch-live")
    finally:
        reporter.join()

    # Then each change was printed, in order, and the job completed
    assert code == 0
    assert lines[0].startswith("ImagePullJob default/watch-live: 0/2 nodes done")
    # node-b has not reported: it counts the size node-a reported
    assert any("1.0 MiB of 4.0 MiB" in line for line in lines)
    assert lines[-2].startswith("ImagePullJob default/watch-live: 2/2 nodes done")
    assert lines[-1] == "ImagePullJob default/watch-live completed: 2/2 nodes succeeded"


def test_watch_times_out_with_exit_1_on_an_unfinished_job(prewarm: Run, control_plane: ControlPlane) -> None:
    # Given a job still pulling
    assert prewarm("apply", "-f", "-", input=job_yaml("watch-slow", nodes=("node-a",))).exit_code == 0
    control_plane.plan("watch-slow")
    control_plane.report("watch-slow", "node-a", "Pulling")

    # When it is watched for half a second
    started = time.monotonic()
    result = prewarm("watch", "job", "watch-slow", "--timeout", "0.5", "--interval", "0.1")

    # Then the watch gives up on time, saying where the job stands
    assert time.monotonic() - started < 5
    assert result.exit_code == 1
    assert result.stderr == "error: timed out after 0.5s waiting for job default/watch-slow to finish: " \
                            "0/1 nodes done (0 succeeded, 0 failed, 1 active, 0 waiting)\n"


def test_watching_a_never_job_ends_when_its_round_has_no_active_or_waiting_node(
    prewarm: Run, control_plane: ControlPlane
) -> None:
    # Given a `Never` job, not planned yet
    manifest = job_yaml("watch-never", nodes=("node-a", "node-b"), completion="Never")
    assert prewarm("apply", "-f", "-", input=manifest).exit_code == 0
    unplanned = prewarm("watch", "job", "watch-never", "--timeout", "0.3", "--interval", "0.1")

    # When its round is planned and every node has pulled
    control_plane.plan("watch-never")
    control_plane.report("watch-never", "node-a", "Succeeded")
    control_plane.report("watch-never", "node-b", "Succeeded")
    code, lines, _ = _watch(prewarm, "watch-never")

    # Then an unplanned round is not mistaken for a finished one, and a done round ends the watch
    assert unplanned.exit_code == 1 and "timed out" in unplanned.stderr
    assert code == 0
    assert lines[-1] == "ImagePullJob default/watch-never round done: 2/2 nodes succeeded"


def test_watching_a_list_job_counts_the_nodes_of_every_image(prewarm: Run, control_plane: ControlPlane) -> None:
    # Given a list job of two images on one node, both pulled
    manifest = "apiVersion: apps.kruise.io/v1alpha1\nkind: ImageListPullJob\nmetadata: {name: watch-list}\n" \
               "spec: {images: [redis:7, memcached:1.6], selector: {names: [node-a]}}\n"
    assert prewarm("apply", "-f", "-", input=manifest).exit_code == 0
    record = control_plane.store.get_job(job_key("default", "watch-list"))
    assert record is not None
    for child in record.children:
        control_plane.plan(child)
        control_plane.report(child, "node-a", "Succeeded")

    # When it is watched
    code, lines, _ = _watch(prewarm, "watch-list")

    # Then both images' nodes count
    assert code == 0
    assert lines[-1] == "ImageListPullJob default/watch-list completed: 2/2 nodes succeeded"


def test_watching_a_missing_job_exits_1(prewarm: Run) -> None:
    result = prewarm("watch", "job", "nope", "--timeout", "1")

    assert (result.exit_code, result.stderr) == (1, 'error: job "nope" not found in namespace "default"\n')


def test_watch_exits_1_when_the_job_itself_failed(prewarm: Run, control_plane: ControlPlane) -> None:
    # Given a job the sweep failed for passing its activeDeadlineSeconds
    assert prewarm("apply", "-f", "-", input=job_yaml("watch-deadline", nodes=("node-a",))).exit_code == 0
    control_plane.plan("watch-deadline")
    control_plane.store.finish_job(job_key("default", "watch-deadline"), {
        "state": "Failed", "message": "job exceeds activeDeadlineSeconds", "completion_time": time.time(),
    }, require_done=False)

    # When it is watched
    code, lines, _ = _watch(prewarm, "watch-deadline")

    # Then the job's own failure is the outcome
    assert code == 1
    assert lines[-1] == "ImagePullJob default/watch-deadline failed: job exceeds activeDeadlineSeconds"
