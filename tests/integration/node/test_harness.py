"""The node harness itself: containerd restarts and crashes, isolation, and the registry's auth."""

from __future__ import annotations

import base64
import http.client
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from prewarm_agent.cri.errors import CriUnavailableError
from prewarm_devtools.node.containerd import PrivateContainerd
from prewarm_devtools.node.registry import LocalRegistry
from prewarm_devtools.node.throttle import ThrottlingProxy
from prewarm_devtools.pytest_plugins.node import OciImageFactory, node_tools_missing

pytestmark = [pytest.mark.node, pytest.mark.integration]


@pytest.fixture
def own_containerd(tmp_path: Path, registry: LocalRegistry) -> Iterator[PrivateContainerd]:
    """A containerd of this test's own, free to be stopped and killed."""
    reason = node_tools_missing()
    if reason:
        pytest.skip(reason)
    instance = PrivateContainerd(tmp_path / "ctd")
    instance.start()
    instance.add_registry_mirror(registry.host, registry.url)
    try:
        yield instance
    finally:
        instance.stop()
        instance.remove_data()


def test_restart_keeps_pulled_images_and_the_socket_is_unavailable_while_down(
    own_containerd: PrivateContainerd, registry: LocalRegistry, oci_image_factory: OciImageFactory
) -> None:
    # Given a pulled image
    image = oci_image_factory.push(registry, "harness/restart")
    with own_containerd.cri_client() as cri:
        cri.pull_image(image.reference).result(timeout=30)

        # When containerd stops, the CRI is unavailable, and a retry is advised
        own_containerd.stop()
        assert not own_containerd.running
        with pytest.raises(CriUnavailableError) as caught:
            cri.version()
        assert caught.value.retryable

        # Then after a start the image is still there
        own_containerd.start()
        info = cri.image_status(image.reference)
    assert info is not None and info.id == image.config_digest


def test_containerd_killed_mid_pull_fails_the_pull_as_unavailable_and_comes_back(
    own_containerd: PrivateContainerd,
    registry: LocalRegistry,
    throttled_registry: ThrottlingProxy,
    oci_image_factory: OciImageFactory,
) -> None:
    # Given a slow pull under way
    own_containerd.add_registry_mirror(throttled_registry.host, throttled_registry.url)
    image = oci_image_factory.push(registry, "harness/crash", size_mb=8).with_host(throttled_registry.host)
    with own_containerd.cri_client() as cri:
        handle = cri.pull_image(image.reference)
        assert throttled_registry.wait_for(lambda proxy: proxy.bytes_to_client > 256 * 1024, timeout=10)

        # When containerd is killed
        own_containerd.kill()

        # Then the pull fails as a retryable unavailability, and a restarted containerd pulls it
        with pytest.raises(CriUnavailableError):
            handle.result(timeout=10)
        own_containerd.start()
        throttled_registry.set_rate(None)
        assert cri.pull_image(image.reference).result(timeout=30) == image.config_digest


def test_every_path_in_the_config_is_under_the_base_dir(own_containerd: PrivateContainerd) -> None:
    # Given the config the harness wrote
    config = own_containerd.config_path.read_text(encoding="utf-8")

    # Then no absolute path points outside the instance's directory, and streaming is loopback only
    paths = re.findall(r'"(/[^"]*)"', config)
    assert paths
    assert all(Path(path).is_relative_to(own_containerd.base_dir) for path in paths), paths
    assert 'stream_server_address = "127.0.0.1"' in config


def _get_v2(registry: LocalRegistry, auth: tuple[str, str] | None) -> tuple[int, str]:
    connection = http.client.HTTPConnection("127.0.0.1", registry.port, timeout=5)
    headers = {}
    if auth:
        headers["Authorization"] = "Basic " + base64.b64encode(f"{auth[0]}:{auth[1]}".encode()).decode()
    try:
        connection.request("GET", "/v2/", headers=headers)
        response = connection.getresponse()
        return response.status, response.getheader("WWW-Authenticate", "")
    finally:
        connection.close()


def test_auth_registry_challenges_with_basic_auth_and_accepts_its_user(auth_registry: LocalRegistry) -> None:
    anonymous, challenge = _get_v2(auth_registry, None)
    wrong, _ = _get_v2(auth_registry, ("prewarm", "nope"))
    right, _ = _get_v2(auth_registry, auth_registry.auth)

    assert (anonymous, wrong, right) == (401, 401, 200)
    assert challenge.startswith("Basic ")


def test_a_stopped_registry_no_longer_answers(tmp_path: Path) -> None:
    reason = node_tools_missing()
    if reason:
        pytest.skip(reason)
    with LocalRegistry(tmp_path / "reg") as registry:
        assert _get_v2(registry, None)[0] == 200
        pid = registry.pid
    assert pid is not None and registry.pid is None
    with pytest.raises(ConnectionRefusedError):
        _get_v2(registry, None)


def test_node_fixtures_explain_why_they_skip_without_root_or_binaries(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    # Given a machine where the tests do not run as root
    monkeypatch.setattr("os.geteuid", lambda: 1000)
    not_root = node_tools_missing()

    # And one where containerd is not installed: neither the host's 1.6 nor the built 2.1
    monkeypatch.setattr("os.geteuid", lambda: 0)
    monkeypatch.setattr("shutil.which", lambda name: None)
    monkeypatch.setattr("prewarm_devtools.node.containerd.CONTAINERD_CACHE", tmp_path)
    monkeypatch.setenv("PREWARM_CONTAINERD", "1.6")
    no_host_containerd = node_tools_missing()
    monkeypatch.setenv("PREWARM_CONTAINERD", "2.1")
    no_built_containerd = node_tools_missing()
    # And one asking for a version that is not offered
    monkeypatch.setenv("PREWARM_CONTAINERD", "1.5")
    unknown = node_tools_missing()

    # Then each reason says what is missing and how to get it
    assert not_root is not None and "root" in not_root
    assert no_host_containerd is not None and "make node-deps PREWARM_CONTAINERD=1.6" in no_host_containerd
    assert no_built_containerd is not None and "containerd 2.1" in no_built_containerd
    assert "make node-deps PREWARM_CONTAINERD=2.1" in no_built_containerd
    assert unknown == "PREWARM_CONTAINERD='1.5' is not one of 2.1, 1.7, 1.6"
