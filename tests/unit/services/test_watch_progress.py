"""What `prewarm watch` counts of a job's bytes: the whole job's from the first size reported on."""

from __future__ import annotations

from prewarm.services.jobs import apply_manifest, view_job
from prewarm.services.reports import register_node
from prewarm_cli.commands.watch import watch_state
from tests.support.cluster import make_node
from tests.support.control_plane import ControlPlane
from tests.support.manifests import job_doc

MIB = 2**20


def test_nodes_not_yet_pulling_count_the_image_size_another_node_reported(plane: ControlPlane) -> None:
    from prewarm.domain.messages import Hello

    # Given ten nodes of a 320 MiB image, two of them pulling and one already done (image present)
    names = [f"n{i}" for i in range(10)]
    for name in names:
        plane.cluster.nodes.append(make_node(name))
        plane.queues.ensure_queue(name)
        register_node(plane.store, plane.queues, None, Hello(node=name), now=plane.now())
    apply_manifest(plane.store, job_doc(parallelism=3, pullPolicy={"timeoutSeconds": 3600}), now=plane.now())
    plane.plan("warm")
    plane.report("warm", "n0", "Pulling", bytes_done=100 * MIB, bytes_total=320 * MIB)
    plane.report("warm", "n1", "Pulling", bytes_done=35 * MIB, bytes_total=320 * MIB)
    plane.report("warm", "n2", "Succeeded")

    # When watch reads the job
    state = watch_state(view_job(plane.store, "default", "warm", now=plane.now(), with_tasks=True))

    # Then the total is the image's size on every node, and the done node counts whole
    assert (state.bytes_done, state.bytes_total) == (455 * MIB, 3200 * MIB)
    assert state.line().endswith(", 455.0 MiB of 3.1 GiB")


def test_watch_counts_nodes_waiting_out_a_registry_s_429_as_throttled_not_failed(plane: ControlPlane) -> None:
    from prewarm.domain.messages import Hello

    # Given three pulling nodes, one of whose agents reports its pull throttled by the registry
    for name in ("n0", "n1", "n2"):
        plane.cluster.nodes.append(make_node(name))
        plane.queues.ensure_queue(name)
        register_node(plane.store, plane.queues, None, Hello(node=name), now=plane.now())
    apply_manifest(plane.store, job_doc(parallelism=3), now=plane.now())
    plane.plan("warm")
    plane.report("warm", "n0", "Pulling", message="throttled by the registry, retrying in 2s (not counted toward "
                                                  "backoffLimit): 429 Too Many Requests")
    plane.report("warm", "n1", "Pulling", message="pulling for 3s")

    # When watch reads the job
    state = watch_state(view_job(plane.store, "default", "warm", now=plane.now(), with_tasks=True))

    # Then it shows one node throttled, none failed
    assert (state.throttled, state.failed, state.active) == (1, 0, 3)
    assert state.line().endswith("; 1 throttled by the registry")
