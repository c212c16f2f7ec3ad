"""The agent reads a node-local mirror (Spegel's `hosts.toml`) and `use_local_image_pull` from a running
containerd's own config and config path, and `prewarm doctor`'s judgement of them (issue 37, "Mirrors")."""

from __future__ import annotations

from pathlib import Path

import pytest

from prewarm.domain.mirrors import NodeMirrors, judge_mirrors
from prewarm.domain.runtimes import ContainerRuntime
from prewarm_agent.mirrors import read_mirror_config
from prewarm_devtools.node.containerd import PrivateContainerd, PullSettings

pytestmark = [pytest.mark.node, pytest.mark.integration]

SPEGEL = "http://127.0.0.1:30020"
# What Spegel writes for each registry it mirrors (its `containerdMirrorAdd`).
SPEGEL_HOSTS = f"""server = "https://registry-1.docker.io"

[host."{SPEGEL}"]
capabilities = ["pull", "resolve"]

[host."http://127.0.0.1:30021"]
capabilities = ["pull", "resolve"]
"""


def spegel_on(containerd: PrivateContainerd) -> None:
    (containerd.certs_dir / "docker.io").mkdir(parents=True, exist_ok=True)
    (containerd.certs_dir / "docker.io" / "hosts.toml").write_text(SPEGEL_HOSTS)


def judged(containerd: PrivateContainerd) -> tuple[NodeMirrors, str]:
    config = read_mirror_config(str(containerd.certs_dir), str(containerd.config_path))
    with containerd.cri_client() as cri:
        runtime = ContainerRuntime.parse(f"containerd://{cri.version().runtime_version}")
    node = NodeMirrors("node-a", config.mirrors, config.local_image_pull, runtime)
    finding = judge_mirrors([node], reported=1)
    return node, f"{'warn' if finding.warning else 'ok'} {finding.text}: {finding.fix}"


def test_a_mirror_in_a_running_containerd_s_config_path_is_read_and_judged(containerd: PrivateContainerd) -> None:
    # Given Spegel's hosts.toml for docker.io beside the local registry's, in the config path containerd runs with
    spegel_on(containerd)
    containerd.add_registry_mirror("127.0.0.1:5999", "http://127.0.0.1:5999")  # a server, not a mirror
    # When the agent reads it
    node, line = judged(containerd)
    # Then docker.io's two mirrors are found, in containerd's order, and the default config does not set
    # use_local_image_pull: on 2.1 the doctor warns that the transfer service ignores the mirror
    assert dict(node.mirrors) == {"docker.io": [SPEGEL, "http://127.0.0.1:30021"]}
    assert node.local_image_pull is False
    assert node.runtime is not None
    if node.runtime.release >= (2, 1, 0):
        assert line.startswith(f"warn node-local mirror on 1 of 1 nodes ({SPEGEL}, http://127.0.0.1:30021 for "
                               "docker.io on node-a), but containerd 2.1+ on 1 (node-a) pulls through its transfer "
                               "service, which ignores it: set use_local_image_pull = true under "
                               "[plugins.'io.containerd.cri.v1.images']"), line
    else:
        assert line.startswith("ok node-local mirror on 1 of 1 nodes"), line


def test_use_local_image_pull_in_a_containerd_2_config_is_read_and_the_mirror_is_ok(
        tmp_path_factory: pytest.TempPathFactory) -> None:
    # Given a containerd 2.x running with use_local_image_pull = true and Spegel's hosts.toml
    try:
        containerd = PrivateContainerd(tmp_path_factory.mktemp("local-pull"), pull=PullSettings(local_pull=True))
    except ValueError as e:  # 1.x has no transfer service to turn off
        pytest.skip(str(e))
    with containerd:
        spegel_on(containerd)
        node, line = judged(containerd)
    # Then the agent reads the setting from the config containerd runs with, and the doctor is content
    assert node.local_image_pull is True
    assert line == f"ok node-local mirror on 1 of 1 nodes ({SPEGEL}, http://127.0.0.1:30021 for docker.io on node-a): "


def test_an_unreadable_config_or_no_config_path_reads_as_unknown_and_no_mirror(tmp_path: Path) -> None:
    (tmp_path / "config.toml").write_text("version = [")
    config = read_mirror_config(str(tmp_path / "missing"), str(tmp_path / "config.toml"))
    assert (dict(config.mirrors), config.local_image_pull) == ({}, None)
    assert read_mirror_config("", "").local_image_pull is None
