"""The registry budget keeps 20 nodes under the registry's layer quota (issue 37, "Budget e2e").

The registry that plays ECR refuses blob requests (GetDownloadUrlForLayer) past 20 a second with ECR's 429
`TOOMANYREQUESTS`. A push of a 10-layer image to 20 nodes (parallelism 20, backoffLimit 0: one counted
failure fails a node) completes with 0 failed nodes and every node on its first attempt, with the stack's
budget at 12 requests a second (few refusals if any: only where a loaded machine delays a node's receive
of its task by a second, so that two starts reach the registry together); the same push with the budget
off (0) is throttled many times over, which proves the quota bites, and its 429s are waited out without a
counted attempt either. Both figures are printed.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import pytest

from prewarm.services.jobs import apply_manifest
from prewarm_devtools.localmode import LocalMode, missing_prerequisites
from tests.support.local_mode import running_local_mode

pytestmark = [pytest.mark.integration, pytest.mark.node,
              pytest.mark.skipif(bool(missing_prerequisites()), reason="; ".join(missing_prerequisites()) or "ok")]

NODES, LAYERS = 20, 10
LAYER_QUOTA = 20.0  # GetDownloadUrlForLayer a second, ECR's 3,000 scaled to this machine
BUDGET = 12  # requests a second: one 12-request pull a second, at most 11 blob requests at an instant
LAYER_API = "ecr:GetDownloadUrlForLayer"


@pytest.fixture(scope="module")
def local(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalMode]:
    with running_local_mode(tmp_path_factory, "budget", nodes=NODES) as mode:
        if mode.aws is None or mode.aws.layer is None:
            pytest.skip("the AWS limits layer is off: it plays ECR's request quotas")
        ecr = mode.aws.layer.ecr
        ecr.quotas = replace(ecr.quotas, ecr_layer_per_s=LAYER_QUOTA)
        apply_manifest(mode.job_store(), {
            "apiVersion": "prewarm.dev/v1alpha1", "kind": "PrewarmRule", "metadata": {"name": "budget"},
            "spec": {"repositories": ["e2e/budget-*"], "template": {"metadata": {"namespace": "default"}, "spec": {
                "parallelism": NODES, "pullPolicy": {"timeoutSeconds": 300, "backoffLimit": 0}}}}}, now=time.time())
        yield mode


def set_budget(local: LocalMode, requests_per_second: int) -> None:
    """The stack's RegistryRequestsPerSecond, as an update of the stack sets every function's environment
    (UpdateFunctionConfiguration: new environments from now on)."""
    assert local.stack is not None
    for function in list(local.stack.functions.values()):
        local.stack.update_function(function.logical_id,
                                    environment={"REGISTRY_REQUESTS_PER_SECOND": str(requests_per_second)})


def push_to_done(local: LocalMode, repository: str) -> dict[str, Any]:
    """Pushes a 10-layer image a rule matches, waits for its job, and answers its figures."""
    assert local.aws is not None and local.aws.layer is not None
    ecr = local.aws.layer.ecr
    throttled_before = ecr.throttled.get(LAYER_API, 0)
    started = time.monotonic()
    pushed = local.push(repository, "v1", size_mb=2, layers=LAYERS)
    (name,) = {line.split("/")[1].split()[0] for line in pushed.jobs}
    store = local.job_store()
    deadline = started + 240
    while (record := store.get_job(f"default/{name}")) is None or record.completion_time is None:
        assert time.monotonic() < deadline, f"default/{name} not complete within 240 s: {record}"
        time.sleep(0.5)
    tasks = store.get_tasks(record.key, shards=record.shards)
    return {"seconds": round(time.monotonic() - started, 1), "succeeded": record.counters.succeeded,
            "failed": record.counters.failed, "layers": record.layers,
            "counted_retries": sum(max(0, t.attempt - 1) for t in tasks),
            "start_span": round(max(starts) - min(starts), 1) if (starts := [t.starts_at for t in tasks
                                                                              if t.starts_at is not None]) else None,
            "throttled_requests": ecr.throttled.get(LAYER_API, 0) - throttled_before}


def test_the_budget_keeps_twenty_nodes_under_the_layer_quota_and_without_it_the_quota_bites(local: LocalMode) -> None:
    set_budget(local, BUDGET)
    paced = push_to_done(local, "e2e/budget-on")
    set_budget(local, 0)
    unpaced = push_to_done(local, "e2e/budget-off")
    print(f"\n{NODES} nodes x {LAYERS} layers, layer quota {LAYER_QUOTA:g}/s: budget {BUDGET}/s {paced}; "
          f"budget off {unpaced}")

    assert paced["layers"] == LAYERS  # read from ECR on the push: each pull costs 12 requests of the budget
    assert (paced["succeeded"], paced["failed"], paced["counted_retries"]) == (NODES, 0, 0)
    # Without the budget the registry refuses, and the agents wait it out without counting an attempt. With
    # it, a refusal comes only when two starts a second apart reach the registry together (an agent's receive
    # held up a second on a loaded machine: 22 blob requests against a burst of 20), and is waited out too.
    assert unpaced["throttled_requests"] > 0
    assert paced["throttled_requests"] < unpaced["throttled_requests"]
    # The budget did the spacing: the reserved starts span what 20 pulls of 12 requests take at 12 a second,
    # less one second's burst (a run the budget never reached reserves none)
    bound = (NODES - 1) * (LAYERS + 2) / BUDGET
    assert paced["start_span"] is not None and paced["start_span"] >= 0.8 * bound, (paced, bound)
    assert unpaced["start_span"] is None
    assert (unpaced["succeeded"], unpaced["failed"], unpaced["counted_retries"]) == (NODES, 0, 0)
