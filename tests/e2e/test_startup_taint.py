"""Issue #12, the startup taint: a node that joins with `prewarm.dev/warming=true:NoSchedule` keeps it
while its `Never` jobs' images are pulled, loses it within 2 s of the last one being present, and
loses it anyway at `MAX_WARM_SECONDS` when a pull keeps failing, with a log line, a metric and an
Event on the node naming the image and why.

A real local stack: moto behind the AWS limits layer, the functions on their event sources, the
embedded Kubernetes API with what `prewarm install` ships (RBAC, the admission policy), the registry
behind a bandwidth-limiting proxy, and a private containerd and agent per node. Nodes join with
`LocalMode.add_node`, as `prewarm local node add NAME --taint ...` does.
"""

from __future__ import annotations

import logging
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from prewarm.domain.nodes import NodeWarm
from prewarm_agent.cri.client import ContentStatusReader
from prewarm_agent.warming import EVENT_REASON
from prewarm_devtools.localecr import ecr_host
from prewarm_devtools.localmode import LocalMode, missing_prerequisites
from tests.support.local_mode import TAINT, apply_planned, never_job, running_local_mode, tainted
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.integration, pytest.mark.node, pytest.mark.timed,
              pytest.mark.skipif(bool(missing_prerequisites()), reason="; ".join(missing_prerequisites()) or "ok")]

MIB = 1024 * 1024
# Two 4 MiB images through 3 MiB/s: a few seconds of pulling to watch the taint stay through.
BANDWIDTH = 3 * MIB
IMAGE_MB = 4
# The agent's deadline: past the join, the pulls and the control plane's list of required images with room
# (the first test took 10 to 17 s alone on this machine, at a0f44a0 and after, most of it before the pulls
# began; over 12 under CI's load).
MAX_WARM_SECONDS = 30
# Issue #12: seconds from the last required image being present to the taint gone.
UNTAINT_WITHIN = 2.0


@pytest.fixture(scope="module")
def local(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalMode]:
    with running_local_mode(tmp_path_factory, "taint", nodes=1, registry_bandwidth=BANDWIDTH,
                            agent_settings={"MAX_WARM_SECONDS": str(MAX_WARM_SECONDS)}) as mode:
        yield mode


def recorded_warm(local: LocalMode, node: str) -> NodeWarm:
    """How the node warmed, once record_status has stored the agent's `Warmed`."""
    assert local.aws is not None and local.stack is not None
    store = local.job_store()
    wait_until(lambda: (n := store.get_node(node)) is not None and n.warm is not None, 10, f"{node}'s warm-up recorded")
    registered = store.get_node(node)
    assert registered is not None and registered.warm is not None
    return registered.warm


def describe(local: LocalMode, *args: str) -> str:
    """`prewarm --local ARGS` in a new process, as a user types it against this stack."""
    done = subprocess.run([sys.executable, "-c", "from prewarm_cli.app import main; main()", "--local", *args],
                          capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    return done.stdout


def ingesting(socket: Path) -> bool:
    with ContentStatusReader(str(socket)) as reader:
        return any(s.ref.startswith("layer-") and s.offset > 0 for s in reader.list_statuses())


def test_the_taint_stays_while_pulls_run_and_goes_within_2_s_of_the_last_image(local: LocalMode) -> None:
    # Given two Never jobs for the "warm" pool, planned before any such node exists
    first, second = local.push("e2e/warm-a", "v1", size_mb=IMAGE_MB), local.push("e2e/warm-b", "v1", size_mb=IMAGE_MB)
    apply_planned(local, never_job("warm-a", first.reference, "warm"), never_job("warm-b", second.reference, "warm"))

    # When a node of that pool joins with the startup taint
    joined = time.monotonic()
    local.add_node("warm-1", labels={"pool": "warm"}, taints=[dict(TAINT)])
    try:
        node = local.nodes["warm-1"]
        present: dict[str, float] = {}
        pulling_while_tainted = False
        while tainted(local, "warm-1"):
            assert time.monotonic() - joined < MAX_WARM_SECONDS, "the taint outlived the pulls"
            pulling_while_tainted = pulling_while_tainted or ingesting(node.containerd.socket_path)
            for image in (first.reference, second.reference):
                if image not in present and node.image_present(image):
                    present[image] = time.monotonic()
            time.sleep(0.02)
        untainted = time.monotonic()

        # Then the taint stayed on while the layers were downloading ...
        assert pulling_while_tainted
        # ... both images are present, and the taint went within 2 s of the last one arriving
        for image in (first.reference, second.reference):
            present.setdefault(image, untainted) if node.image_present(image) else pytest.fail(f"{image} missing")
        delay = untainted - max(present.values())
        print(f"\ntaint removed {delay:.3f} s after the last image was present, "
              f"{untainted - joined:.1f} s after the node joined")
        assert delay < UNTAINT_WITHIN

        # And the control plane learns how the node warmed: `prewarm describe` shows hello to warm.
        # The agent sends that after its log, gauge and Event, so waiting for it orders the checks below.
        warm = recorded_warm(local, "warm-1")
        assert node.agent.metrics.sample("prewarm_agent_startup_taint_removals_total", {"outcome": "warm"}) == 1
        assert warm.outcome == "warm" and not warm.missing
        assert node.agent.hello_at is not None and warm.hello_at == pytest.approx(node.agent.hello_at, abs=0.01)
        assert 0 < warm.hello_to_warm <= warm.join_to_warm < untainted - joined + 2
        described = describe(local, "describe", "job", "warm-a")
        assert "Startup Taint (nodes that joined with it):" in described and "warm-1" in described
        assert "Hello To Warm:" in describe(local, "describe", "node", "warm-1")
    finally:
        local.remove_node("warm-1")


def test_the_taint_goes_at_max_warm_seconds_with_an_event_when_a_pull_keeps_failing(
    local: LocalMode, caplog: pytest.LogCaptureFixture
) -> None:
    # Given a Never job for the "cold" pool whose image does not exist: every attempt fails
    missing = f"{ecr_host()}/e2e/never-pushed:v1"
    apply_planned(local, never_job("cold", missing, "cold", backoffLimit=1000))
    caplog.set_level(logging.INFO, logger="prewarm_agent")

    # When a node of that pool joins with the startup taint
    local.add_node("cold-1", labels={"pool": "cold"}, taints=[dict(TAINT)])
    try:
        assert local.kube is not None
        created = time.mktime(time.strptime(
            local.kube.get_object("nodes", "cold-1")["metadata"]["creationTimestamp"], "%Y-%m-%dT%H:%M:%SZ"
        )) - time.timezone
        assert tainted(local, "cold-1")
        wait_until(lambda: not tainted(local, "cold-1"), MAX_WARM_SECONDS + 10, "the taint removed at the deadline")
        untainted = time.time()

        # Then it stayed until MAX_WARM_SECONDS after the node joined (the timestamp has whole seconds) ...
        assert untainted >= created + MAX_WARM_SECONDS - 0.1
        assert untainted < created + MAX_WARM_SECONDS + 1 + UNTAINT_WITHIN
        # The agent logs, counts and posts the Event after the patch lands, then sends `Warmed`:
        # once record_status has stored that, everything checked below has happened.
        warm = recorded_warm(local, "cold-1")
        # ... the agent said so, naming the image and its failure ...
        (line,) = [r.getMessage() for r in caplog.records if r.getMessage().startswith("node not warm after")]
        assert missing.split("/", 1)[1].split(":")[0] in line and "pull failed" in line, line
        node = local.nodes["cold-1"]
        assert node.agent.metrics.sample("prewarm_agent_startup_taint_removals_total", {"outcome": "timeout"}) == 1
        # ... and so does an Event on the node, in `default` where a Node's events live
        events = [e for e in local.kube.list_objects("events", "default")
                  if e["involvedObject"].get("name") == "cold-1" and e["reason"] == EVENT_REASON]
        assert len(events) == 1, events
        (event,) = events
        assert event["type"] == "Warning" and event["involvedObject"]["kind"] == "Node"
        assert "never-pushed" in event["message"] and "pull failed" in event["message"], event["message"]
        # ... and `prewarm describe node` says it came off at the deadline, naming the image
        assert warm.outcome == "timeout" and warm.missing == (missing,) and warm.missing_total == 1
        assert "removed at maxWarmSeconds" in describe(local, "describe", "node", "cold-1")
    finally:
        local.remove_node("cold-1")
