"""The agent image tier: builds the image as `make agent-image` does (once per run) and runs it."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from prewarm_devtools.agent_image import BuiltImage, build_image, host_architecture, missing_tools

# `make e2e` builds the image once and hands its archive to this tier; a run of its own builds it here.
PREBUILT = "PREWARM_AGENT_IMAGE_DIR"
# The architecture to build and check (`make image-tests-arm64`: arm64, run under qemu-user-static).
ARCH = "PREWARM_AGENT_IMAGE_ARCH"


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if "tests/image/" in str(item.fspath):
            item.add_marker(pytest.mark.image)


@pytest.fixture(scope="session")
def agent_image(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BuiltImage]:
    if os.geteuid() != 0:
        pytest.skip("building and running the agent image needs root (mmdebstrap, umoci, containerd)")
    architecture = os.environ.get(ARCH) or host_architecture()
    if missing := missing_tools(architecture):
        pytest.fail(f"missing {', '.join(missing)}: make e2e installs them (devtools/image-deps.sh)")
    prebuilt = os.environ.get(PREBUILT)
    out = Path(prebuilt) if prebuilt else tmp_path_factory.mktemp("agent-image")
    yield build_image(out, architecture=architecture, log=False, reuse=bool(prebuilt))
