"""A seed wave on a local stack (issue 37, "Waves"): a rule whose jobs carry `prewarm.dev/seed-wave: "1"`
pulls on one node per zone first, and on the other nodes only once those seeds are done.

Four nodes in two zones (us-west-2a and us-west-2b, two each); a push of a small image the rule matches.
Every node succeeds, the seeds are one node of each zone, and no other node's task was dispatched or its
pull started before every seed had finished.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from prewarm.domain.placement import ZONE_LABEL
from prewarm.services.jobs import apply_manifest
from prewarm_devtools.localmode import LocalMode, missing_prerequisites
from prewarm_devtools.node.images import host_architecture
from tests.support.local_mode import running_local_mode

pytestmark = [pytest.mark.integration, pytest.mark.node, pytest.mark.timeout(600),
              pytest.mark.skipif(bool(missing_prerequisites()), reason="; ".join(missing_prerequisites()) or "ok")]

ZONES = ["us-west-2a", "us-west-2b"]


@pytest.fixture(scope="module")
def local(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalMode]:
    with running_local_mode(tmp_path_factory, "waves", nodes=4) as mode:
        assert mode.kube is not None
        # Two nodes in each of two zones, all of the pushed image's platform (the synthetic cluster spreads
        # its nodes over three zones and two architectures).
        nodes = sorted(mode.kube.list_objects("nodes"), key=lambda n: n["metadata"]["name"])
        for index, node in enumerate(nodes):
            node["metadata"]["labels"].update({ZONE_LABEL: ZONES[index % 2], "kubernetes.io/arch": host_architecture()})
        mode.kube.seed_objects(nodes)
        apply_manifest(mode.job_store(), {
            "apiVersion": "prewarm.dev/v1alpha1", "kind": "PrewarmRule", "metadata": {"name": "waves"},
            "spec": {"repositories": ["e2e/waves"], "template": {
                "metadata": {"namespace": "default", "annotations": {"prewarm.dev/seed-wave": "1"}},
                "spec": {"parallelism": 10, "pullPolicy": {"timeoutSeconds": 120, "backoffLimit": 0}}}}},
            now=time.time())
        yield mode


def test_the_other_nodes_start_only_after_one_seed_per_zone_is_done(local: LocalMode) -> None:
    assert local.kube is not None
    pushed = local.push("e2e/waves", "v1", size_mb=2, layers=2)
    (name,) = {line.split("/")[1].split()[0] for line in pushed.jobs}
    store = local.job_store()
    deadline = time.monotonic() + 180
    while (record := store.get_job(f"default/{name}")) is None or record.completion_time is None:
        assert time.monotonic() < deadline, f"default/{name} not complete within 180 s: {record}"
        time.sleep(0.5)
    tasks = {t.node: t for t in store.get_tasks(record.key, shards=record.shards)}
    assert (record.counters.desired, record.counters.succeeded) == (4, 4), tasks

    zones = {n["metadata"]["name"]: n["metadata"]["labels"][ZONE_LABEL] for n in local.kube.list_objects("nodes")}
    assert len(record.seeds) == 2 and sorted(zones[s] for s in record.seeds) == ZONES
    seeds_done = max(tasks[s].finished_at or 0 for s in record.seeds)
    rest = [t for n, t in tasks.items() if n not in record.seeds]
    print(f"\nseeds {record.seeds} done at +{seeds_done - pushed.pushed_at:.2f} s; rest dispatched at "
          f"{[round((t.dispatched_at or 0) - pushed.pushed_at, 2) for t in rest]} s after the push")
    assert len(rest) == 2
    for task in rest:
        assert task.dispatched_at is not None and task.dispatched_at >= seeds_done, task
        assert task.started_at is not None and task.started_at >= seeds_done, task
