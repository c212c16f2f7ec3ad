"""The benchmarks still run: each at a tiny size, in its own process (it starts local servers there).

Correctness only: the JSON line's fields and the counts that do not depend on speed. Timing
targets are the benchmarks' business (`make bench`), never asserted here.
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import os
import platform
import re
import signal
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from benchmarks.agent_overhead import image_left, missing_node_tools
from benchmarks.cold_start import (
    ImportLine,
    bytecode_written,
    discover_functions,
    import_costs,
    least,
    parse_importtime,
    read_only_copy,
)
from benchmarks.cold_start import main as cold_start_main
from benchmarks.e2e_latency import Fit, FunctionClock
from benchmarks.measure import ROOT, Target
from benchmarks.sweep_parts import outside_repairs
from prewarm_devtools.lambda_layers import LayerBuildError, build_layer, lambda_code_dir, set_writable

IMPORTTIME = """\
import time: self [us] | cumulative | imported package
import time:       300 |        300 |   json.decoder
import time:       200 |        500 | json
import time:      1000 |       1000 |       pydantic.main
import time:      2000 |       2000 |       yaml
import time:      4000 |       7000 |     prewarm.domain.jobs
import time:      2000 |       9000 |   prewarm.services.dispatch
import time:      3000 |       3000 |     botocore.client
import time:       500 |       3500 |   prewarm.bootstrap
import time:       100 |      12600 | app
import time:      9000 |       9000 | kubernetes.client.configuration
"""


def run_benchmark(script: str, *args: str, timeout: float = 240) -> dict[str, Any]:
    # A session of its own: on a timeout its whole group goes (fleet.py forks moto and starts the
    # embedded API, which would outlive a kill of the script alone).
    with subprocess.Popen([sys.executable, f"benchmarks/{script}", *args], cwd=ROOT, stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, text=True, start_new_session=True) as process:
        try:
            stdout, stderr = process.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.communicate()
            raise
    done = subprocess.CompletedProcess(process.args, process.returncode, stdout, stderr)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


@pytest.mark.integration
def test_select_nodes_both_sides_select_the_same_nodes_and_report_every_field() -> None:
    # Given a 60-node synthetic cluster, when both sides select the two node groups once
    result = run_benchmark("select_nodes.py", "--nodes", "60", "--repeat", "1")
    # Then the JSON line has every field, and the selection is a real part of the cluster
    assert set(result) == {"nodes", "selected", "prewarm_s", "baseline_s", "speedup", "prewarm_peak_mb",
                           "baseline_peak_mb"}
    assert result["nodes"] == 60 and 0 < result["selected"] < 60


@pytest.mark.slow
@pytest.mark.integration
def test_fanout_sends_one_task_per_node_in_one_call_each() -> None:
    # Given 40 nodes whose queues exist, when one job fans out to all of them
    result = run_benchmark("fanout.py", "--nodes", "40", "--parallelism", "40", "--baseline-nodes", "10")
    # Then every node got its task with one SendMessage, the nodes were listed in one page and the agent
    # DaemonSet read once
    assert result["nodes"] == 40
    assert result["calls"]["SendMessage"] == 40 and result["sqs_calls_per_node"] == 1.0
    assert result["kube_calls"] == 2
    assert result["baseline"]["extrapolated"] is True and result["baseline"]["calls"]["PutItem"] >= 10


def test_registry_budget_paces_a_small_fleet_without_a_429_and_writes_only_its_key() -> None:
    # Given 300 nodes pulling a 10-layer image (3,300 blob requests: more than ECR's 3,000 a second)
    result = run_benchmark("registry_budget.py", "--nodes", "300", "--layers", "10", "--rate", "1200",
                           "--resend-nodes", "60", "--resend-rate", "2")
    paced, unpaced = result["budget"], result["no_budget"]
    # Then the paced run is never throttled and serves every request, the unpaced one is throttled
    assert (paced["requests"], paced["throttled_requests"], paced["pulls_throttled"]) == (300 * 12, 0, 0)
    assert unpaced["requests"] == 300 * 12 and unpaced["throttled_requests"] > 0
    assert paced["bound_s"] == 3.0 and paced["finish_s"] >= paced["last_start_s"]
    # And the budget wrote one key, once per batch of 99 claims
    assert [(k["key"].split(":", 1)[1], k["writes"]) for k in result["keys_written"]] == [
        ("BUDGET#ecr:123456789012:us-west-2", 4)]
    # And starts further away than the sweep's re-send threshold (60 pulls of 16 s) are reserved once
    # each, no node is failed while it waits, and the last starts within the bound
    resends = result["resends"]
    assert (resends["pulls"], resends["nodes_failed"], resends["starts_reserved"]) == (60, 0, 60)
    assert resends["bound_s"] - 16 <= resends["last_start_s"] <= resends["bound_s"]


def test_a_release_reads_its_repositorys_jobs_not_every_job() -> None:
    # Given 40 jobs over 10 repositories, 4 of the released job's, each on 3 nodes
    result = run_benchmark("release_reads.py", "--jobs", "40", "--repositories", "10", "--nodes", "3")
    # Then the release reads its own 3 node items, the 4 jobs' keys and items, and the 3 others' node items
    assert result["prewarm"]["items_read"] == 3 + 2 * 4 + 3 * 3 and result["prewarm"]["releases_sent"] == 3
    # ... where the lookup over every job reads all 40 jobs' keys and items, and the 3 others' node items
    assert result["baseline"]["items_read"] == 2 * 40 + 3 * 3 and result["targets_met"]


@pytest.mark.slow
@pytest.mark.integration
def test_resource_sync_writes_only_what_changed() -> None:
    # Given 30 job resources over 3 namespaces, when they are synced, synced again, and 4 are edited
    result = run_benchmark("resource_sync.py", "--jobs", "30", "--namespaces", "3", "--edit", "4")
    # Then the first sync applies and writes every one, the second nothing, the third only the edits
    first, steady, edited = result["first"], result["steady"], result["edited"]
    assert (first["applied"], first["statuses_written"], first["dynamodb_writes"]) == (30, 30, 30)
    assert (steady["applied"], steady["statuses_written"], steady["dynamodb_writes"]) == (0, 0, 0)
    # One per kind (jobs, list jobs, rules, warm snapshots, cron jobs) and the namespaces (their warm budgets)
    assert steady["kubernetes_calls"] == {"list": 6}
    assert (edited["applied"], edited["statuses_written"], edited["dynamodb_writes"]) == (4, 4, 4)


@pytest.mark.slow
@pytest.mark.integration
def test_cold_start_measures_every_function_against_the_naive_baseline(tmp_path: Path) -> None:
    # Given every function of functions/, when each is imported and invoked once on its sample event
    # (a function that misses its import target is broken down from one run under -X importtime)
    kept = tmp_path / "lambda"
    result = run_benchmark("cold_start.py", "--repeat", "1", "--explain-runs", "1", "--keep", str(kept))
    # Then each has an import and a first-invoke figure, compared with the baseline's import
    assert set(result["functions"]) == set(discover_functions())
    for figures in result["functions"].values():
        assert figures["import_ms"] > 0 and figures["first_invoke_ms"] >= 0
    assert result["baseline_import_ms"] > 0 and result["worst_ratio"] > 0
    # And it says which Python compiled the layer it measured
    assert result["layer_python"] == platform.python_version()
    # And the deps layer it measured, built by its Makefile for this machine (sam build: python3.13 on
    # arm64), has every requirement, compiled like the shared layer (SAM's pip builder ships source only)
    layer = kept / "deps-layer" / "python"
    for package in ("boto3", "botocore", "aws_lambda_powertools", "aws_xray_sdk", "kubernetes", "pydantic", "yaml"):
        assert (layer / package / "__init__.py").is_file(), package
    assert_unchecked_hash_bytecode(sorted((layer / "botocore").rglob("*.py")))


def test_the_built_shared_layer_has_unchecked_hash_bytecode_for_every_module(tmp_path: Path) -> None:
    # When the shared layer is built as sam build builds it, by this interpreter
    layer = build_layer("shared", tmp_path)
    # Then every module has its .pyc, valid without checking the source (flags 0b01: hash, unchecked)
    modules = sorted(layer.rglob("*.py"))
    assert modules and all(m.is_relative_to(layer / "prewarm") for m in modules)
    assert_unchecked_hash_bytecode(modules)


def assert_unchecked_hash_bytecode(modules: list[Path]) -> None:
    for module in modules:
        pyc = Path(importlib.util.cache_from_source(str(module)))
        header = pyc.read_bytes()[:8]
        assert header[:4] == importlib.util.MAGIC_NUMBER and int.from_bytes(header[4:8], "little") == 0b01, pyc


def test_cold_start_refuses_a_kept_directory_that_is_not_empty_and_explain_runs_below_one(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Given a directory that holds a file
    (tmp_path / "earlier").write_text("x")
    # When cold_start would build into it, it refuses, naming the directory, and leaves it as it was
    refused = re.escape(f"--keep {tmp_path}: the directory is not empty")
    with pytest.raises(LayerBuildError, match=refused), lambda_code_dir(tmp_path):
        pytest.fail("the directory was used")
    assert [p.name for p in tmp_path.iterdir()] == ["earlier"]
    # And a kept directory that is new is made, used, and stays writable afterwards
    kept = tmp_path / "new"
    with lambda_code_dir(kept) as code:
        (code / "f").write_text("y")
        set_writable(code, False)
    assert (kept / "f").read_text() == "y" and (kept / "f").stat().st_mode & 0o200
    # And --explain-runs 0 is a usage error naming the option
    with pytest.raises(SystemExit) as exited:
        cold_start_main(["--explain-runs", "0"])
    assert exited.value.code == 2 and "--explain-runs must be at least 1" in capsys.readouterr().err


def test_read_only_copies_carry_no_bytecode_and_bytecode_written_later_is_found(tmp_path: Path) -> None:
    # Given a function's code with stale bytecode beside it
    source = tmp_path / "function"
    (source / "__pycache__").mkdir(parents=True)
    (source / "app.py").write_text("x = 1\n")
    (source / "__pycache__" / "app.cpython-311.pyc").write_bytes(b"stale")
    layer = tmp_path / "copies" / "layer"
    (layer / "__pycache__").mkdir(parents=True)
    (layer / "__pycache__" / "m.cpython-311.pyc").write_bytes(b"built")
    # When it is copied for a cold start and made read-only
    copy = read_only_copy(source, tmp_path / "copies" / "function")
    set_writable(tmp_path / "copies", False)
    # Then the copy has the source only, nothing under it is writable, and the layer's bytecode is no finding
    assert sorted(p.name for p in copy.rglob("*")) == ["app.py"]
    assert all(p.stat().st_mode & 0o222 == 0 for p in [copy, *copy.rglob("*")])
    assert bytecode_written(tmp_path / "copies", [layer]) == []
    # And bytecode appearing beside the function's code is
    set_writable(tmp_path / "copies", True)
    (copy / "__pycache__").mkdir()
    (copy / "__pycache__" / "app.cpython-311.pyc").write_bytes(b"written")
    assert bytecode_written(tmp_path / "copies", [layer]) == [copy / "__pycache__" / "app.cpython-311.pyc"]


def test_import_costs_split_the_handler_tree_from_what_came_before_and_after() -> None:
    # Given -X importtime output with json imported before the handler and kubernetes during its invoke
    costs = import_costs(parse_importtime(IMPORTTIME), "app")
    # Then only the handler's tree is charged to it, by package (with who imported it) and by direct import
    assert costs.total_ms == pytest.approx(12.6)
    assert costs.by_package == [("prewarm", pytest.approx(6.5), ""), ("botocore", 3.0, ""),
                                ("yaml", 2.0, "prewarm.domain.jobs"), ("pydantic", 1.0, ""), ("app", 0.1, "")]
    assert costs.direct == [("prewarm.services.dispatch", 9.0), ("prewarm.bootstrap", 3.5)]
    assert costs.heaviest[0] == ("prewarm.domain.jobs", 4.0)
    assert costs.on_invoke == [("kubernetes.client.configuration", 9.0)]


def test_least_keeps_the_tree_and_takes_each_modules_smallest_figure() -> None:
    # Given two runs where noise slowed a different module in each
    first = parse_importtime(IMPORTTIME)
    second = parse_importtime(IMPORTTIME.replace("3000 |       3000 |     botocore", "1000 |  1000 |     botocore"))
    slowed = [line if line.name != "yaml" else ImportLine(9.0, 9.0, line.depth, "yaml") for line in first]
    # When the runs are combined
    combined = least([slowed, second])
    # Then the structure is the first run's, and every figure the smaller one
    assert [(line.name, line.depth) for line in combined] == [(line.name, line.depth) for line in first]
    figures = {line.name: (line.self_ms, line.cumulative_ms) for line in combined}
    assert figures["yaml"] == (2.0, 2.0) and figures["botocore.client"] == (1.0, 1.0)


def test_targets_say_whether_a_bound_is_met_in_either_direction() -> None:
    assert Target("time", 0.25, 0.3, " s").met
    assert not Target("time", 0.35, 0.3, " s").met
    assert Target("speedup", 6.0, 5.0, "x", at_least=True).met
    assert "NOT met" in Target("speedup", 4.0, 5.0, "x", at_least=True).line()


# --- 4. agent overhead and 5. end to end: real containerd and registry, as root -------------------

NODE_TOOLS_MISSING = "; ".join(missing_node_tools())


@pytest.mark.slow
@pytest.mark.integration
@pytest.mark.node
@pytest.mark.skipif(bool(NODE_TOOLS_MISSING), reason=NODE_TOOLS_MISSING or "node tools present")
def test_agent_overhead_pulls_one_image_directly_and_through_both_agents() -> None:
    # Given a 1 MB image, when it is pulled once each way from a fresh content store
    result = run_benchmark("agent_overhead.py", "--image-mb", "1", "--repeat", "1", "--warmup", "0",
                           "--receive-wait", "1")
    # Then every way produced a time, and the ratios are the ones of those times
    assert {"image_mb", "direct_s", "agent_s", "ratio", "progress_ratio"} <= set(result)
    assert result["image_mb"] == 1
    assert result["direct_s"] > 0 and result["agent_s"] > 0 and result["agent_progress_s"] > 0
    assert result["ratio"] == pytest.approx(result["agent_s"] / result["direct_s"], rel=0.01)
    assert result["progress_ratio"] == pytest.approx(result["agent_progress_s"] / result["agent_s"], rel=0.01)
    assert set(result["steps_s"]) == {"delivery", "before_pull", "pull", "after_pull", "report_send"}


@pytest.mark.slow
@pytest.mark.integration
@pytest.mark.node
@pytest.mark.skipif(bool(NODE_TOOLS_MISSING), reason=NODE_TOOLS_MISSING or "node tools present")
def test_e2e_latency_follows_one_push_to_every_node_and_measures_the_floor() -> None:
    # Given local mode with two nodes, when one 1 MB image is pushed
    result = run_benchmark("e2e_latency.py", "--nodes", "2", "--image-mb", "1", "--pushes", "1")
    # Then both nodes pulled it, the first pull came before completion, and the floor was measured
    assert result["nodes"] == 2 and result["desired"] == 2 and result["pushes"] == 1
    assert 0 < result["push_to_first_pull_s"] <= result["push_to_done_s"]
    assert result["direct_pull_s"] > 0


@pytest.mark.slow
@pytest.mark.integration
@pytest.mark.node
@pytest.mark.skipif(bool(NODE_TOOLS_MISSING), reason=NODE_TOOLS_MISSING or "node tools present")
def test_pull_limit_pulls_one_image_per_setting_and_compares_each_with_the_floor() -> None:
    # Given an 8 MiB image of two layers, when containerd 2.1 pulls it by default and without the transfer service
    result = run_benchmark("pull_limit.py", "--image-mb", "8", "--layers", "2", "--versions", "2.1",
                           "--settings", "default,local pull (no transfer service)")
    # Then each pull has its time and its ratio to the floor, which the measured rates give
    assert result["layers"] == 2 and result["unpacked_bytes"] == 8 * 1024 * 1024
    assert [(p["version"], p["setting"]) for p in result["pulls"]] == [
        ("2.1", "default"), ("2.1", "local pull (no transfer service)")]
    slower = min(result["registry_read_mib_s"], result["disk_write_mib_s"]) * 1024 * 1024
    assert result["floor_s"] == pytest.approx(result["image_bytes"] / slower, abs=0.01)
    assert all(p["vs_floor"] == pytest.approx(p["seconds"] / result["floor_s"], rel=0.05, abs=0.05)
               for p in result["pulls"])


@pytest.mark.slow
@pytest.mark.integration
@pytest.mark.node
@pytest.mark.skipif(bool(NODE_TOOLS_MISSING), reason=NODE_TOOLS_MISSING or "node tools present")
def test_boot_warm_boots_one_node_from_the_snapshot_and_one_that_pulls() -> None:
    # Given a 2 MB image of 2 layers, baked; when a node joins from the snapshot and another pulls
    result = run_benchmark("boot_warm.py", "--image-mb", "2", "--layers", "2", "--timeout", "120", timeout=400)
    # Then both had the image and lost the startup taint, and the restore was measured apart, before the join
    for way in ("snapshot", "pulled"):
        assert result[way]["join_to_images_present_s"] is not None, way
        assert result[way]["join_to_taint_released_s"] is not None, way
    assert result["restore_s"] > 0 and result["layers"] == 2
    assert result["snapshot"]["boot_before_join_s"] > result["restore_s"]


@pytest.mark.parametrize("script", ["agent_overhead", "e2e_latency", "pull_limit"])
def test_node_benchmarks_exit_non_zero_naming_what_is_missing(
    script: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # Given a machine without root or containerd
    import prewarm_devtools.localmode

    missing = ["root: containerd needs root", "containerd: apt-get install -y containerd"]
    monkeypatch.setattr(prewarm_devtools.localmode, "missing_prerequisites", lambda: missing)
    module = importlib.import_module(f"benchmarks.{script}")
    # When the benchmark starts
    with pytest.raises(SystemExit) as exited:
        module.main([])
    # Then it stops before measuring, non-zero, and says what is missing
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert all(problem in err for problem in missing)


class _Ingests:
    def __init__(self, refs: list[str]) -> None:
        self.refs = refs

    def __call__(self) -> list[Any]:
        return [SimpleNamespace(ref=ref) for ref in self.refs]


def test_image_left_names_blobs_downloads_and_snapshots_until_they_are_gone(tmp_path: Path) -> None:
    # Given a containerd root holding one of two blobs, a download in progress and a snapshot
    blobs = tmp_path / "io.containerd.content.v1.content" / "blobs" / "sha256"
    blobs.mkdir(parents=True)
    (blobs / ("a" * 64)).write_bytes(b"layer")
    snapshot = tmp_path / "io.containerd.snapshotter.v1.overlayfs" / "snapshots" / "7"
    snapshot.mkdir(parents=True)
    ingests = _Ingests(["layer-sha256:" + "c" * 64])
    containerd = SimpleNamespace(root_dir=tmp_path, snapshotter="overlayfs", stats_ingest=ingests)
    digests = ["sha256:" + "a" * 64, "sha256:" + "b" * 64]
    # When asked what is left, Then each of them is named
    assert image_left(containerd, digests) == [f"blob {digests[0]}", f"download layer-sha256:{'c' * 64}", "snapshot 7"]
    # And once they are gone nothing is
    (blobs / ("a" * 64)).unlink()
    snapshot.rmdir()
    ingests.refs = []
    assert image_left(containerd, digests) == []


def test_function_clock_counts_invocations_records_and_time_per_function() -> None:
    # Given a stack whose invoke it wraps
    stack = SimpleNamespace(invoke=lambda name, event: f"{name} done")
    clock = FunctionClock(stack)
    before = clock.snapshot()
    # When one stream batch of three records and one event go through the stack
    assert stack.invoke("DispatchJobFunction", {"Records": [{}, {}, {}]}) == "DispatchJobFunction done"
    stack.invoke("OnImagePushFunction", {"detail": {}})
    # Then each function has its invocation and records counted (an event is one record)
    since = clock.since(before)
    assert {name: figures[:2] for name, figures in since.items()} == {
        "DispatchJobFunction": (1, 3), "OnImagePushFunction": (1, 1)}
    assert clock.since(clock.snapshot()) == {}


def test_fit_says_why_a_node_count_does_not_fit() -> None:
    cores = os.cpu_count() or 1
    fits = Fit(nodes=20, start_s=9.0, process_mb=500, containerd_mb=780, available_mb=20_000, idle_cores=0.1)
    assert fits.problems == []
    tight = Fit(nodes=20, start_s=9.0, process_mb=500, containerd_mb=780, available_mb=300, idle_cores=cores)
    assert [problem.split()[0] for problem in tight.problems] == ["only", "idle,"]


FLEET_KEYS = {"nodes", "reports", "sim_seconds", "wall_seconds", "hottest_key", "hottest_key_writes_per_report",
              "hottest_key_wcu_per_s", "throttles", "transaction_conflicts", "dlq_messages", "lost_reports",
              "counters_exact", "job_item_bytes", "slot_refill_p50_s", "slot_refill_p99_s", "returned_items"}


@pytest.mark.slow
@pytest.mark.integration
def test_fleet_loses_no_report_and_keeps_exact_counters_on_both_paths() -> None:
    # Given 20 simulated agents with short pulls, failures, duplicates, reordering and one restart
    # (two rounds of moto calls: minutes on a slow or busy machine, hence the longer timeout)
    result = run_benchmark("fleet.py", "--nodes", "20", "--pull-median", "8", "--old-window", "3", timeout=600)
    # Then the JSON line has every field, nothing was lost and the counters are exact in both runs
    assert set(result) >= FLEET_KEYS
    assert result["nodes"] == 20 and result["reports"] > 20
    assert result["lost_reports"] == 0 and result["counters_exact"] is True and result["dlq_messages"] == 0
    assert result["never"]["counters_exact"] is True and result["never"]["slot_refill_p50_s"] is not None
    # And each round says how many items its batches handed back; those that came again waited at least
    # record_status' first backoff (2 s), as SQS kept them hidden (rounded to 0.1 s)
    rounds = (result["always"], result["never"])
    assert result["returned_items"] == sum(round_["returned_items"] for round_ in rounds)
    for round_ in rounds:
        assert isinstance(round_["returned_items"], int) and round_["returned_items"] >= 0
        assert round_["returned_wait_p50_s"] is None or round_["returned_wait_p50_s"] >= 1.9
    # And the old path wrote the job item with every report it applied
    assert result["old"]["job_item_writes_per_report"] >= 1.0
    # And in the Never round (parallelism 10: freed slots refilled) the registry budget wrote its one key a
    # few times, once per batch of tasks sent, not once a report
    (budget,) = result["never"]["budget_keys"].values()
    assert 1 <= budget["writes"] <= 20 < result["never"]["reports"]


@pytest.mark.slow
@pytest.mark.integration
def test_fleet_runs_the_never_round_alone_with_its_figures_at_the_top() -> None:
    # Given the Never job's daily round asked for alone, with no old-path replay
    result = run_benchmark("fleet.py", "--nodes", "10", "--pull-median", "5", "--old-window", "0", "--rounds", "never",
                           timeout=600)
    # Then the top level holds that round's figures, slot refill included, and the Always job is null
    assert set(result) >= FLEET_KEYS and result["rounds"] == "never"
    assert result["always"] is None and result["old"] is None and result["never"]["old"] is None
    assert result["reports"] == result["never"]["reports"] > 10
    assert result["lost_reports"] == 0 and result["counters_exact"] is True and result["dlq_messages"] == 0
    assert result["slot_refill_p50_s"] == result["never"]["slot_refill_p50_s"] is not None


@pytest.mark.slow
@pytest.mark.integration
def test_fleet_of_two_clusters_warms_both_from_one_push_and_shares_only_the_index_keys_of_new_items() -> None:
    # Given two clusters of 10 nodes with the same names, each agent saying hello with its cluster, and one push
    result = run_benchmark("fleet.py", "--nodes", "20", "--clusters", "2", "--pull-median", "8", "--rounds", "always",
                           timeout=600)
    # Then the push made one job per cluster, each with its own nodes, reports, exact counters and no loss
    assert set(result) >= FLEET_KEYS and result["cluster_count"] == 2
    clusters = result["clusters"]
    assert set(clusters) == {"local", "fleet-2"}
    for figures in clusters.values():
        assert figures["nodes"] == 10 and figures["reports"] > 10 and figures["counters_exact"] is True
        assert figures["lost_reports"] == 0 and figures["dlq_messages"] == 0 and figures["crossed_tasks"] == 0
        assert figures["counters"]["desired"] == 10 and figures["state"] == "Completed"
    # (each cluster's hottest key is one of its own job's keys)
    assert "JOB#default/" in clusters["local"]["hottest_key"]
    assert "JOB#fleet-2:default/" in clusters["fleet-2"]["hottest_key"]
    assert result["reports"] == sum(f["reports"] for f in clusters.values()) and result["lost_reports"] == 0
    assert max(f["peak_reports_per_s"] for f in clusters.values()) <= result["peak_reports_per_s"] <= sum(
        f["peak_reports_per_s"] for f in clusters.values())
    # And the only keys both clusters' traffic wrote are the kinds index's keys of a new job and a new cluster
    # (one write per item created, keys only: no report writes them); the stack's own items are the rule's and
    # the flight index's markers (one per job planned, under one partition), and the registry's budget, which
    # every cluster's tasks share by design (one write per batch of tasks sent)
    assert {k.rpartition("/")[2]: v for k, v in result["shared_keys"].items()} == {
        "kinds:job": {"local": 1, "fleet-2": 1}}
    assert {k.partition(":")[2] for k in result["stack_keys"]} == {
        "RULE#fleet", "rule", "INDEX#flight", "BUDGET#ecr:123456789012:us-west-2"}
    assert result["foreign_keys"] == {}
    # And each cluster has its own 10 node queues, none of them another's
    assert result["queues"]["node_queues"] == {"local": 10, "fleet-2": 10}
    assert result["queues"]["queues_of_several_clusters"] == []


@pytest.mark.slow
@pytest.mark.integration
def test_capacity_models_both_scenarios_and_loses_nothing() -> None:
    # Given 20 pulling nodes for 10 s, and 10 nodes joining while 2 Never and 3 finished jobs exist
    result = run_benchmark("capacity.py", "--nodes", "20", "--seconds", "10", "--joining", "10", "--join-window", "3",
                           "--never-jobs", "2", "--finished-jobs", "3", timeout=600)
    status, storm = result["status"], result["storm"]
    # Then every report is stored, its node holds the newest progress and the counters are exact
    assert status["reports"] > 20 and status["lost_reports"] == 0 and status["progress_not_newest"] == 0
    assert status["counters_exact"] is True and status["dlq"] == 0
    assert status["round_trips_per_batch"] > 0 and status["lag_p50_s"] <= status["lag_p99_s"] <= status["lag_max_s"]
    # And every joining node is registered, in both Never jobs and told its images, nothing in the DLQ
    assert storm["registered"] == storm["sent_required_images"] == storm["in_every_never_job"] == 10
    assert storm["dlq"] == 0 and storm["counters_exact"] is True and storm["last_told_s"] is not None


@pytest.mark.slow
@pytest.mark.integration
def test_capacity_succeeded_wave_meets_concurrent_invocations_on_the_job_item_and_completes_the_job() -> None:
    # Given 200 pulling nodes whose Succeeded reports all come at once (two full batches together)
    result = run_benchmark("capacity.py", "--scenario", "wave", "--nodes", "200", "--wave-window", "0", timeout=600)
    wave = result["wave"]
    # Then two invocations transacted on the job item at once: one was refused, backed off and retried
    assert wave["invocations_at_once"] == 2 and wave["transactions_on_job_item"] == 4
    assert wave["conflicts"] >= 1 and wave["conflicts"] == wave["retries"] + wave["gave_up_invocations"]
    assert wave["gave_up_invocations"] == 0 and wave["completed_s"] > wave["completed_s_without_conflicts"] > 0
    # And the job completed with every node counted once, nothing returned to the queue or dead-lettered
    assert wave["state"] == "Completed" and wave["succeeded"] == 200 and wave["counters_exact"] is True
    assert (wave["returned"], wave["dlq"]) == (0, 0) and wave["peak_job_item_wcu_per_s"] > 0


@pytest.mark.integration
def test_moto_queues_times_both_codes_at_every_depth() -> None:
    result = run_benchmark("moto_queues.py", "--depths", "20,60", "--calls", "1")
    assert set(result) == {"moto", "patched"}
    for figures in result.values():
        assert set(figures) == {"20", "60"}
        assert all(f["send_batch_ms"] > 0 and f["receive_ms"] > 0 for f in figures.values())


@pytest.mark.slow
@pytest.mark.integration
def test_sweep_forgets_every_departed_node_and_then_reads_metadata_only() -> None:
    # Given 30 nodes with 50 images each and 6 departed, when the sweep runs cold and then warm
    result = run_benchmark("sweep.py", "--nodes", "30", "--images", "50", "--departed", "6")
    cold, warm = result["cold"], result["warm"]
    # Then the cold run forgets the departed, each read once more, and reads the nodes past their deadline whole
    assert (cold["queues_deleted"], cold["nodes_forgotten"], cold["departures_deferred"]) == (6, 6, 0)
    assert cold["kubernetes_calls"]["get nodes (metadata)"] == 6 and cold["nodes_settled"] == 30
    assert cold["aws_calls"]["sqs DeleteQueue"] == 6 == cold["aws_calls"]["dynamodb DeleteItem"]
    # ... and the warm run lists the nodes as metadata and reads no node whole
    assert warm["kubernetes_calls"] == {"get configmaps (full)": 1, "list nodes (metadata)": 1}
    assert warm["queues_deleted"] == 0 and warm["peak_rss_mb"] > 0 and result["targets_met"] is True


def test_the_sweep_benchmarks_runs_keep_out_of_the_node_repairs_minutes_whatever_the_wall_clock() -> None:
    from prewarm.services.node_facts import REPAIR_EVERY_RUNS

    for minute in range(3 * REPAIR_EVERY_RUNS):
        now = minute * 60 + 7.5
        moved = outside_repairs(now, 2)
        assert all(int(moved // 60 + i) % REPAIR_EVERY_RUNS for i in range(2)), minute
        assert moved % 60 == 7.5 and 0 <= now - moved <= 120  # whole minutes back, no more than needed
        assert moved == now or int(now // 60) % REPAIR_EVERY_RUNS in (0, REPAIR_EVERY_RUNS - 1)


@pytest.mark.slow
@pytest.mark.integration
def test_sweep_with_running_jobs_reads_their_nodes_in_flight_and_releases_new_tainted_nodes_first() -> None:
    # Given 3 running Never jobs of 40 nodes, 4 of each in flight, and 2 new nodes tainted with no hello
    result = run_benchmark("sweep.py", "--scenario", "jobs", "--nodes", "40", "--images", "5", "--jobs", "3",
                           "--job-nodes", "40", "--in-flight", "4", "--tainted", "2")
    first, later = result["prewarm"]["first"], result["prewarm"]["next"]
    # Then the first run releases both taints and reads every job, and the next reads the jobs' nodes in
    # flight (3 x 4 items) beside the job and node listings, never every node item
    assert first["taints_released"] == 2 and first["jobs_read"] == 3 == later["jobs_read"]
    assert later["kubernetes_calls"] == {"get configmaps (full)": 1, "list nodes (metadata)": 1}
    assert later["aws_calls"]["dynamodb BatchGetItem"] >= 3 and result["targets_met"] is True
    # ... each run's reads in calls, items and read units (at least half a unit a call), its wall time per
    # phase, and its modelled time on AWS, fail-open's within it
    for run in (first, later):
        assert run["dynamodb_reads"] >= 3 + 3 and run["read_units"] >= run["dynamodb_reads"] / 2
        assert run["items_read"] >= 3 * 4 and set(run["phases_s"]) == {"clusters", "listings", "job loop", "the rest"}
        assert 0 < run["modelled_fail_open_s"] <= run["modelled_s"] and run["modelled_calls_s"]["job loop"] > 0
    # ... the first run's fail-open reading 40 nodes whole and patching 2, at 10 ms a call (LATENCY_S)
    assert first["modelled_calls_s"]["clusters"] >= 0.01 * (40 + 2)
    assert first["kubernetes_calls"]["patch nodes (full)"] == 2
