"""Issue #25: `prewarm get nodes` says why a node holds the startup taint and what became of it. A node
that joins tainted with no agent shows no agent, the taint held and when the sweep removes it; once the
sweep has, it shows the taint released by the sweep, with the reason its Event gives.

A real local stack (moto behind the AWS limits layer, the embedded Kubernetes API with what `prewarm
install` ships, one node with its agent), and the CLI as a user runs it against it.
"""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from prewarm.domain.kubernetes import format_time, parse_time
from prewarm_devtools.localmode import LocalMode, missing_prerequisites
from tests.support.local_mode import running_local_mode

pytestmark = [pytest.mark.integration, pytest.mark.node,
              pytest.mark.skipif(bool(missing_prerequisites()), reason="; ".join(missing_prerequisites()) or "ok")]

MAX_WARM_SECONDS = 4
GRACE_SECONDS = 1
PREWARM = str(Path(sys.executable).with_name("prewarm"))
TAINT = {"key": "prewarm.dev/warming", "value": "true", "effect": "NoSchedule"}


@pytest.fixture(scope="module")
def local(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalMode]:
    with running_local_mode(tmp_path_factory, "get-nodes", nodes=1, max_warm_seconds=MAX_WARM_SECONDS,
                            parameters={"StartupTaintGraceSeconds": str(GRACE_SECONDS)},
                            agent_settings={"MAX_WARM_SECONDS": str(MAX_WARM_SECONDS)}) as mode:
        yield mode


def get_nodes(local: LocalMode) -> tuple[dict[str, str], str]:
    """`prewarm --local get nodes` as a user runs it (a process of its own: the stack's functions log to this
    one's stdout): each row by node name, and stderr."""
    result = subprocess.run([PREWARM, "--local", "get", "nodes"], capture_output=True, text=True, timeout=60,
                            check=False)
    assert result.returncode == 0, result.stdout + result.stderr
    header, *rows = result.stdout.splitlines()
    assert header.split()[:2] == ["NAME", "AGENT"] and header.split()[-1] == "MESSAGE"
    return {row.split()[0]: row for row in rows}, result.stderr


def test_get_nodes_says_why_a_node_with_no_agent_is_tainted_then_that_the_sweep_freed_it(local: LocalMode) -> None:
    # Given a node that joins with the startup taint and no agent, beside a node with its agent
    local.add_node("bare-1", labels={}, taints=[dict(TAINT)], agent=False)
    assert local.kube is not None
    obj = local.kube.get_object("nodes", "bare-1")
    assert obj is not None
    joined = parse_time(obj["metadata"]["creationTimestamp"])
    assert joined is not None

    # When nodes are listed before its deadline
    rows, stderr = get_nodes(local)

    # Then it shows no agent, the taint held, and when the sweep removes it; the other node its agent
    bare = rows["bare-1"].split()
    assert bare[:2] == ["bare-1", "Absent"] and "   tainted   " in rows["bare-1"]
    assert ("startup taint held and no agent has reported from this node; the sweep removes it after "
            f"{format_time(joined + MAX_WARM_SECONDS + GRACE_SECONDS)} (in ") in rows["bare-1"]
    (agent_node,) = [name for name in rows if name != "bare-1"]
    assert rows[agent_node].split()[1] == "Registered"
    assert "1 of 2 nodes has no agent" in stderr and "warning" not in stderr

    # When the sweep runs past the deadline and the grace
    time.sleep(max(0.0, joined + MAX_WARM_SECONDS + GRACE_SECONDS + 1 - time.time()))
    fired = local.fire("sweep")
    assert "bare-1" in fired["result"]["taints_released"], fired

    # Then the node shows the taint released by the sweep, with its Event's reason
    rows, _ = get_nodes(local)
    assert "   released   " in rows["bare-1"]
    assert "no agent has reported from this node; startup taint removed by the sweep " in rows["bare-1"]
    assert ("ago: no Prewarm agent removed the startup taint prewarm.dev/warming:NoSchedule within "
            in rows["bare-1"])
    assert rows["bare-1"].endswith("taint removed so pods can schedule")
