"""Node-local mirrors: what containerd's files say, what the hello carries, and the doctor's judgement."""

from __future__ import annotations

import pytest

from prewarm.domain.messages import Hello, parse_agent_message
from prewarm.domain.mirrors import (
    LOCAL_PULL_FIX,
    MirrorConfig,
    NodeMirrors,
    hosts_toml_mirrors,
    judge_mirrors,
    uses_local_image_pull,
)
from prewarm.domain.runtimes import ContainerRuntime

SPEGEL = 'server = "https://registry-1.docker.io"\n[host."http://127.0.0.1:30020"]\ncapabilities = ["pull"]\n' \
         '[host."http://127.0.0.1:30021"]\ncapabilities = ["pull"]\n'
C21, C20, C17 = (ContainerRuntime.parse(f"containerd://{v}") for v in ("2.1.5", "2.0.6", "1.7.27"))


def test_a_hosts_toml_s_host_tables_are_its_mirrors_in_order_and_a_server_alone_is_none() -> None:
    assert hosts_toml_mirrors(SPEGEL) == ["http://127.0.0.1:30020", "http://127.0.0.1:30021"]
    assert hosts_toml_mirrors('server = "http://127.0.0.1:5000"\n[host]\n') == []
    assert hosts_toml_mirrors("") == []
    with pytest.raises(ValueError, match="not TOML"):
        hosts_toml_mirrors("[host")


@pytest.mark.parametrize(("config", "local"), [
    ("version = 3\n[plugins.'io.containerd.cri.v1.images']\nuse_local_image_pull = true\n", True),
    ('version = 2\n[plugins."io.containerd.grpc.v1.cri"]\nuse_local_image_pull = true\n', True),
    ("version = 3\n[plugins.'io.containerd.cri.v1.images']\nuse_local_image_pull = false\n", False),
    ("version = 3\n[plugins.'io.containerd.cri.v1.images']\nsnapshotter = 'overlayfs'\n", False),
    ("version = 2\n", False),
])
def test_use_local_image_pull_is_read_where_containerd_2_reads_it(config: str, local: bool) -> None:
    assert uses_local_image_pull(config) is local


def test_the_hello_carries_the_mirror_config_and_leaves_it_out_when_unread() -> None:
    config = MirrorConfig(mirrors={"docker.io": ["http://127.0.0.1:30020"]}, local_image_pull=False)
    hello = Hello(node="n1", mirror_config=config)
    assert parse_agent_message(hello.model_dump_json()) == hello
    # A control plane older than the field refuses a hello that has it, even as null.
    assert "mirror_config" not in Hello(node="n1").model_dump_json()


def test_no_mirror_is_ok_and_says_every_node_pulls_from_the_registry() -> None:
    finding = judge_mirrors([NodeMirrors("n1", {}, False, C21)], reported=1)
    assert not finding.warning and finding.text.startswith("no node-local registry mirror")


def test_containerd_2_1_without_local_image_pull_ignores_the_mirror_and_is_named() -> None:
    nodes = [NodeMirrors(f"n{i}", {"docker.io": ["http://127.0.0.1:30020"]}, False, C21) for i in range(5)]
    finding = judge_mirrors([*nodes, NodeMirrors("ok", {"_default": ["http://127.0.0.1:30020"]}, True, C21)],
                            reported=7)
    assert finding.warning and finding.fix == LOCAL_PULL_FIX
    assert finding.text == ("node-local mirror on 6 of 7 nodes (http://127.0.0.1:30020 for docker.io on n0), but "
                            "containerd 2.1+ on 5 (n0, n1, n2 and 2 more) pulls through its transfer service, "
                            "which ignores it")


def test_older_containerd_or_the_setting_or_an_unread_config_is_not_warned_about() -> None:
    mirror = {"docker.io": ["http://127.0.0.1:30020"]}
    for node in (NodeMirrors("a", mirror, False, C20), NodeMirrors("b", mirror, False, C17),
                 NodeMirrors("c", mirror, True, C21)):
        assert not judge_mirrors([node], reported=1).warning, node
    unread = judge_mirrors([NodeMirrors("d", mirror, None, C21)], reported=1)
    assert not unread.warning and unread.text.endswith("; containerd's config unread on 1")
    # A runtime not reported is taken as the newest, which the setting governs.
    assert judge_mirrors([NodeMirrors("e", mirror, False, None)], reported=1).warning
