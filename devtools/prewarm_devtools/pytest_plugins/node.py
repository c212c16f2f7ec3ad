"""pytest fixtures for node tests: a private containerd, local registries, images and a slow link.

Registered in ``tests/conftest.py``. Every fixture skips, with the reason, when not running as root or
when containerd / docker-registry are missing (``make node-deps`` installs them as root). When a test
using them fails, the end of the daemons' logs is attached to its report.
"""

from __future__ import annotations

import os
import re
from collections.abc import Generator, Iterator, Sequence
from dataclasses import dataclass

import pytest

from prewarm_devtools.node.containerd import ContainerdVersionError, PrivateContainerd, containerd_missing
from prewarm_devtools.node.images import PushedImage, RegistryPusher, build_image, build_index
from prewarm_devtools.node.registry import LocalRegistry, registry_binary
from prewarm_devtools.node.throttle import ThrottlingProxy

# Credentials of the ``auth_registry`` fixture.
AUTH_USERNAME = "prewarm"
AUTH_PASSWORD = "pull-secret"
# containerd's words when a registry that asks for credentials is given none: 1.6 and 1.7 send the request
# and quote the registry's 401; 2.x sends none and says it has no credentials for the challenge.
REFUSED_WITHOUT_CREDENTIALS = re.compile(r"401 Unauthorized|authorization failed: no basic auth credentials")
# Default download limit of ``throttled_registry``: a 16 MiB layer takes 16 s.
THROTTLED_BYTES_PER_SECOND = 1024 * 1024

_LOGGED_FIXTURES = ("containerd", "registry", "auth_registry")


def node_tools_missing() -> str | None:
    """Why node tests cannot run here, or None when they can."""
    if os.geteuid() != 0:
        return "node tests need root: containerd mounts image snapshots (CI and `make test` as root run them)"
    try:
        missing = containerd_missing()
    except ContainerdVersionError as e:
        return str(e)
    if missing is not None:
        return missing
    if registry_binary() is None:
        return "docker-registry is not installed: run `make node-deps` as root"
    return None


def _require_node_tools() -> None:
    reason = node_tools_missing()
    if reason is not None:
        pytest.skip(reason)


@pytest.fixture(scope="module")
def containerd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PrivateContainerd]:
    """A running private containerd shared by the tests of one module; its data is deleted after."""
    _require_node_tools()
    instance = PrivateContainerd(tmp_path_factory.mktemp("containerd"))
    instance.start()
    try:
        yield instance
    finally:
        instance.stop()
        instance.remove_data()


def _running_registry(
    tmp_path_factory: pytest.TempPathFactory, name: str, users: dict[str, str] | None
) -> Iterator[LocalRegistry]:
    _require_node_tools()
    registry = LocalRegistry(tmp_path_factory.mktemp(name), htpasswd_users=users)
    registry.start()
    try:
        yield registry
    finally:
        registry.stop()
        registry.remove_data()


@pytest.fixture(scope="module")
def registry(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalRegistry]:
    """An open registry on 127.0.0.1, shared by the tests of one module."""
    yield from _running_registry(tmp_path_factory, "registry", None)


@pytest.fixture(scope="module")
def auth_registry(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalRegistry]:
    """A registry that needs HTTP Basic auth as ``AUTH_USERNAME``/``AUTH_PASSWORD`` (``.auth``)."""
    yield from _running_registry(tmp_path_factory, "auth-registry", {AUTH_USERNAME: AUTH_PASSWORD})


@dataclass(frozen=True)
class OciImageFactory:
    """Builds small OCI images and pushes them to a ``LocalRegistry`` (with its credentials)."""

    def push(
        self,
        registry: LocalRegistry,
        repository: str,
        tag: str = "v1",
        *,
        files: dict[str, bytes] | None = None,
        size_mb: float = 0.0,
        architecture: str | None = None,
        chunk_size: int | None = None,
    ) -> PushedImage:
        """Push a one-layer image (``files`` and/or ``size_mb`` random MiB) for one platform."""
        image = build_image(files=files, size_mb=size_mb, architecture=architecture)
        return RegistryPusher(registry.url, registry.auth, chunk_size).push_image(repository, tag, image)

    def push_index(
        self,
        registry: LocalRegistry,
        repository: str,
        tag: str = "v1",
        *,
        architectures: Sequence[str] = ("amd64", "arm64"),
        size_mb: float = 0.0,
    ) -> PushedImage:
        """Push a multi-platform index with one image per architecture (all linux)."""
        index = build_index([build_image(size_mb=size_mb, architecture=arch) for arch in architectures])
        return RegistryPusher(registry.url, registry.auth).push_index(repository, tag, index)


@pytest.fixture(scope="session")
def oci_image_factory() -> OciImageFactory:
    """Builds and pushes test images; see ``OciImageFactory``."""
    return OciImageFactory()


@pytest.fixture
def throttled_registry(registry: LocalRegistry) -> Iterator[ThrottlingProxy]:
    """A proxy to ``registry`` limiting downloads to ``THROTTLED_BYTES_PER_SECOND`` (``set_rate`` changes it).

    Pull ``image.with_host(proxy.host)`` after ``containerd.add_registry_mirror(proxy.host, proxy.url)``.
    """
    with ThrottlingProxy(("127.0.0.1", registry.port), THROTTLED_BYTES_PER_SECOND) as proxy:
        yield proxy


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    """Attach the tail of containerd's and the registries' logs to a failing node test's report."""
    report: pytest.TestReport = yield
    if report.failed:
        funcargs = getattr(item, "funcargs", {})
        for name in _LOGGED_FIXTURES:
            daemon = funcargs.get(name)
            if daemon is not None and hasattr(daemon, "log_tail"):
                report.sections.append((f"{name} log", daemon.log_tail(60)))
    return report
