"""The agent runs from its image as the DaemonSet's pod would: a small local stack whose node agent is a
container on the node's containerd, set up from the DaemonSet `prewarm install` rendered into the
cluster (mounts, environment, read-only root, no capabilities, no privilege escalation, seccomp, the
memory limit). It pulls through the CRI, answers its probes and metrics, and on SIGTERM as PID 1
drains, cancels its pull and releases the task for the next agent, which finishes it.
"""

from __future__ import annotations

import json
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from prewarm.domain.messages import NodePhase
from prewarm.domain.status import NodeTaskRecord
from prewarm.services.jobs import apply_manifest
from prewarm_devtools.agent_image import BuiltImage, host_architecture
from prewarm_devtools.localmode import LocalMode, missing_prerequisites
from prewarm_devtools.node.agent import agent_output_path
from prewarm_devtools.node.container import AgentContainer
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.integration, pytest.mark.node,
              pytest.mark.skipif(bool(missing_prerequisites()), reason="; ".join(missing_prerequisites()) or "ok")]

MIB = 1024 * 1024
# The node pulls at about 2 MiB/s: a 24 MiB image takes about 12 s, long enough to stop mid-pull.
BANDWIDTH = 2 * MIB


@pytest.fixture(scope="module")
def local(agent_image: BuiltImage, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalMode]:
    if agent_image.architecture != host_architecture():
        pytest.skip(f"a local stack runs the node's own architecture ({host_architecture()}), not "
                    f"{agent_image.architecture}")
    state = tmp_path_factory.mktemp("container") / "local.json"
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("PREWARM_LOCAL_STATE", str(state))
        with LocalMode(nodes=1, agent_image=agent_image.archive, registry_bandwidth=BANDWIDTH) as mode:
            yield mode


def job(name: str, image: str, node: str, completion: str = "Always") -> dict[str, object]:
    return {"apiVersion": "apps.kruise.io/v1alpha1", "kind": "ImagePullJob",
            "metadata": {"name": name, "namespace": "default"},
            "spec": {"image": image, "parallelism": 1, "selector": {"names": [node]},
                     "pullPolicy": {"backoffLimit": 0, "timeoutSeconds": 120},
                     "completionPolicy": {"type": completion}}}


def get(port: int, path: str) -> tuple[int, str]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as answer:
        return answer.status, answer.read().decode()


def log_messages(path: Path) -> list[str]:
    return [json.loads(line).get("message", "") for line in path.read_text(errors="replace").splitlines()
            if line.startswith("{")]


def test_the_containerized_agent_pulls_answers_its_probes_and_drains_on_sigterm(local: LocalMode) -> None:
    store = local.job_store()
    (name, node), = local.nodes.items()
    agent = node.agent
    assert isinstance(agent, AgentContainer)
    # Its settings are the DaemonSet's: read-only root, every capability dropped, the node's socket
    assert "--read-only" in agent.run.flags and "--cap-drop=CAP_SYS_CHROOT" in agent.run.flags
    assert "--allow-new-privs" not in agent.run.flags and "--seccomp" in agent.run.flags
    assert "--memory-limit=268435456" in agent.run.flags  # limits.memory: 256Mi, enforced by the cgroup
    assert any(f.endswith(",dst=/run/containerd/containerd.sock,options=rbind:rw") for f in agent.run.flags)
    assert agent.run.env["CRI_SOCKET"] == "/run/containerd/containerd.sock"
    assert agent.run.env["NODE_NAME"] == name

    # Given a job over the node
    small = local.push("image/small", "v1", size_mb=1)
    apply_manifest(store, job("small", small.reference, name), now=time.time())

    def task(key: str) -> NodeTaskRecord | None:
        return store.get_task(key, name)

    # Then the agent in its container pulls it through the node's containerd
    wait_until(lambda: (t := task("default/small")) is not None and t.phase is NodePhase.SUCCEEDED, 60,
               "the pull through the containerized agent")
    assert node.image_present(small.reference)
    # ... and answers its probes and metrics from the host, on its port
    assert get(agent.http_port, "/readyz")[0] == 200
    assert get(agent.http_port, "/healthz")[0] == 200
    status, metrics = get(agent.http_port, "/metrics")
    assert status == 200 and 'prewarm_agent_pulls_total{outcome="Succeeded"} 1.0' in metrics

    # Given a pull under way, of a Never job (it keeps running: the released pull's Cancelled is not its end)
    big = local.push("image/big", "v1", size_mb=24)
    apply_manifest(store, job("big", big.reference, name, completion="Never"), now=time.time())
    wait_until(lambda: (t := task("default/big")) is not None and bool(t.bytes_done), 30, "bytes of the big pull")

    # When the kubelet stops the pod: SIGTERM to the agent, PID 1 of its container
    agent.stop(grace=10)

    # Then it drained, cancelled the pull, released the task and exited 0
    assert agent.exit_status == 0, agent.log_tail()
    messages = log_messages(agent_output_path(local.logs_dir, name))
    assert any(m.startswith("released for a restarted agent (pulling: True)") for m in messages), messages[-10:]
    assert "stopped" in messages
    assert not node.image_present(big.reference)

    # When the DaemonSet's next pod starts, it takes the released task and finishes the pull
    agent.start()
    try:
        wait_until(lambda: (t := task("default/big")) is not None and t.phase is NodePhase.SUCCEEDED, 60,
                   "the released pull finished by the next agent")
    except AssertionError as e:
        raise AssertionError(f"{e}; node item {task('default/big')}; agent log:\n{agent.log_tail(30)}") from None
    assert node.image_present(big.reference)
