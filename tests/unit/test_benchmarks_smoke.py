"""The benchmarks still run: each at a tiny size, in its own process (it starts local servers there).

Correctness only: the JSON line's fields and the counts that do not depend on speed. Timing
targets are the benchmarks' business (`make bench`), never asserted here.
"""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

import pytest

from benchmarks.cold_start import ImportLine, discover_functions, import_costs, least, parse_importtime
from benchmarks.measure import ROOT, Target

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


def run_benchmark(script: str, *args: str) -> dict[str, Any]:
    done = subprocess.run([sys.executable, f"benchmarks/{script}", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=240, check=False)
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


@pytest.mark.integration
def test_fanout_sends_one_task_per_node_in_one_call_each() -> None:
    # Given 40 nodes whose queues exist, when one job fans out to all of them
    result = run_benchmark("fanout.py", "--nodes", "40", "--parallelism", "40", "--baseline-nodes", "10")
    # Then every node got its task with one SendMessage, and the nodes were listed in one page
    assert result["nodes"] == 40
    assert result["calls"]["SendMessage"] == 40 and result["sqs_calls_per_node"] == 1.0
    assert result["kube_calls"] == 1
    assert result["baseline"]["extrapolated"] is True and result["baseline"]["calls"]["PutItem"] >= 10


@pytest.mark.integration
def test_cold_start_measures_every_function_against_the_naive_baseline() -> None:
    # Given every function of functions/, when each is imported and invoked once on its sample event
    result = run_benchmark("cold_start.py", "--repeat", "1")
    # Then each has an import and a first-invoke figure, compared with the baseline's import
    assert set(result["functions"]) == set(discover_functions())
    for figures in result["functions"].values():
        assert figures["import_ms"] > 0 and figures["first_invoke_ms"] >= 0
    assert result["baseline_import_ms"] > 0 and result["worst_ratio"] > 0


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
