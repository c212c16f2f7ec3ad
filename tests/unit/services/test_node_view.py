"""`prewarm get nodes` says why each node is as it is (issue #25): a node tainted with no agent and when
the sweep frees it, the sweep's release with its reason, a warming node with its time left, a dead agent,
and how many nodes lack a working agent; with the cluster out of reach, what it can still say."""

from __future__ import annotations

from typing import Any

from prewarm.domain.kubernetes import format_time
from prewarm.domain.liveness import REPORT_INTERVAL_SECONDS
from prewarm.domain.messages import Hello
from prewarm.services.jobs import apply_manifest
from prewarm.services.nodes import view_nodes
from prewarm.services.ports import ClusterAuthError
from prewarm.services.reports import register_node
from prewarm.services.schedules import release_overdue_taints
from prewarm_cli.node_output import node_document, nodes_summary, nodes_table
from prewarm_cli.output import rfc3339
from tests.support.clock import Clock
from tests.support.cluster import make_node
from tests.support.control_plane import ControlPlane
from tests.support.manifests import job_doc

GRACE = 60.0
MAX_WARM = 900
TAINT = {"key": "prewarm.dev/warming", "value": "true", "effect": "NoSchedule"}


def joined(plane: ControlPlane, name: str, *, tainted: bool = True, agent: bool = True,
           warm_until: float | None = None) -> float:
    """A node joins now (with the startup taint); with `agent`, its agent says hello."""
    now = plane.now()
    obj = make_node(name)
    obj["metadata"]["creationTimestamp"] = format_time(now)
    if tainted:
        obj["spec"] = {"taints": [dict(TAINT)]}
    plane.cluster.nodes.append(obj)
    if agent:
        register_node(plane.store, plane.queues, None, Hello(node=name, warm_until=warm_until), now=now)
    return float(int(now))


def rows(plane: ControlPlane) -> tuple[dict[str, list[str]], dict[str, str], Any]:
    """Each row's columns (MESSAGE last, whole) by node name, each node's MESSAGE, and the view."""
    now = plane.now()
    view = view_nodes(plane.store, plane.cluster, now=now, grace=GRACE)
    header, *lines = nodes_table(view.nodes, now=now).splitlines()
    start = header.index("MESSAGE")
    assert header.split() == ["NAME", "AGENT", "ARCH", "INSTANCE-TYPE", "ZONE", "LAST-HELLO", "WARM", "BOOT",
                              "CONDITION", "MESSAGE"]
    table = {line.split()[0]: line[:start].split() for line in lines}
    return table, {line.split()[0]: line[start:] for line in lines}, view


def test_a_tainted_node_with_no_agent_says_so_and_when_the_sweep_frees_it_then_that_the_sweep_did(
    plane: ControlPlane,
) -> None:
    clock = plane.clock
    assert isinstance(clock, Clock)
    # Given a node that joined with the startup taint and no agent, not Ready (a Ready one is freed
    # NoAgentGraceSeconds after it became Ready: tests/unit/domain/test_node_state.py)
    at = joined(plane, "bare-1", agent=False)
    plane.cluster.nodes[-1]["status"]["conditions"] = [{"type": "Ready", "status": "False"}]

    # When nodes are listed
    table, messages, view = rows(plane)

    # Then it shows no agent, the taint held, and when the sweep removes it
    assert table["bare-1"][:2] == ["bare-1", "Absent"] and table["bare-1"][-4:-2] == ["<none>", "tainted"]
    sweep_at = at + MAX_WARM + GRACE
    assert messages["bare-1"].startswith("startup taint held and no agent has reported from this node; "
                                         f"the sweep removes it after {rfc3339(sweep_at)} (in 15m)")
    assert nodes_summary(view.nodes) == "1 of 1 nodes has no agent"
    assert view.problems == []

    # When the sweep is late, it says so
    clock.advance(MAX_WARM + GRACE + 30)
    assert "overdue for 3" in rows(plane)[1]["bare-1"]

    # When the sweep removes the taint (with its Event)
    assert release_overdue_taints(plane.cluster, plane.cluster.nodes, now=plane.now(), grace=GRACE) == ["bare-1"]
    table, messages, view = rows(plane)

    # Then the node says the sweep removed it, and why, from the Event
    assert table["bare-1"][-3] == "released"
    assert messages["bare-1"].startswith("no agent has reported from this node; startup taint removed by the sweep 1s "
                                         "ago: no Prewarm agent removed the startup taint prewarm.dev/warming:"
                                         "NoSchedule within 17m of the node's join (maxWarmSeconds 900)")
    doc = node_document(view.nodes[0], now=plane.now())
    assert doc["kind"] == "PrewarmNode" and doc["status"]["agent"] == "Absent"
    assert doc["status"]["startupTaint"]["removedBy"] == "sweep"


def test_a_warming_node_says_how_long_its_agent_holds_the_taint_at_most(plane: ControlPlane) -> None:
    now = plane.now()
    joined(plane, "warm-1", warm_until=now + 600)
    table, messages, _ = rows(plane)
    assert table["warm-1"][1] == "Registered" and table["warm-1"][-3] == "warming"
    assert messages["warm-1"].startswith("startup taint held by its agent until its images are present, 9m5")
    assert messages["warm-1"].endswith("s more at most")


def test_a_node_whose_agent_died_mid_pull_counts_as_not_reporting(plane: ControlPlane) -> None:
    clock = plane.clock
    assert isinstance(clock, Clock)
    # Given two nodes pulling, one of whose agents then goes silent
    joined(plane, "live-1", tainted=False)
    joined(plane, "dead-1", tainted=False)
    apply_manifest(plane.store, job_doc(selector={"names": ["live-1", "dead-1"]},
                                        pullPolicy={"timeoutSeconds": 3600}), now=plane.now())
    plane.plan("warm")
    plane.report("warm", "dead-1", "Pulling", bytes_done=10, bytes_total=100)
    clock.advance(3 * REPORT_INTERVAL_SECONDS)
    plane.report("warm", "live-1", "Pulling", bytes_done=10, bytes_total=100)

    # When nodes are listed
    table, messages, view = rows(plane)

    # Then the dead one's agent is not reporting, and the count says how many
    assert (table["dead-1"][1], table["live-1"][1]) == ("NotReporting", "Registered")
    assert messages["dead-1"] == "agent not reporting: 1 pull without a report for over 15s"
    assert messages["live-1"] == ""
    assert nodes_summary(view.nodes) == "1 of 2 nodes has an agent not reporting"
    assert node_document(view.nodes[0], now=plane.now())["status"]["silentPulls"] == 1


def test_without_the_cluster_it_shows_the_agents_and_says_what_it_could_not_read(plane: ControlPlane) -> None:
    now = plane.now()
    joined(plane, "warm-1", warm_until=now + 600)
    joined(plane, "bare-1", agent=False)

    unreachable = view_nodes(plane.store, None, now=now, grace=GRACE, unreachable="cannot reach the cluster (401)")
    assert [s.name for s in unreachable.nodes] == ["warm-1"]
    assert unreachable.problems == ["cannot reach the cluster (401): only nodes whose agent said hello are shown, "
                                    "and their startup taint as their agents last told"]

    class Forbidden:
        def list_nodes(self, *args: Any, **kwargs: Any) -> Any:
            raise ClusterAuthError("nodes is forbidden", status=403, reason="Forbidden")

    forbidden = view_nodes(plane.store, Forbidden(), now=now, grace=GRACE)  # type: ignore[arg-type]
    assert [s.name for s in forbidden.nodes] == ["warm-1"]
    assert forbidden.problems[0].startswith("cannot list the cluster's nodes (nodes is forbidden)")
