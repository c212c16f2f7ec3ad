"""The agent image is built as agent/Dockerfile says, for the architecture asked, and its agent runs."""

from __future__ import annotations

import json
import re
import subprocess
import tarfile
from pathlib import Path

import pytest

from prewarm_devtools.agent_image import BASE_ENV, BuiltImage, Dockerfile, containerd_name, package_version
from prewarm_devtools.node.containerd import PrivateContainerd

pytestmark = [pytest.mark.integration, pytest.mark.node]


def blob(archive: Path, digest: str) -> dict[str, object]:
    with tarfile.open(archive) as tar:
        member = tar.extractfile(f"blobs/sha256/{digest.removeprefix('sha256:')}")
        assert member is not None
        return json.loads(member.read())  # type: ignore[no-any-return]


def image_config(archive: Path) -> tuple[dict[str, object], dict[str, object]]:
    with tarfile.open(archive) as tar:
        index_file = tar.extractfile("index.json")
        assert index_file is not None
        index = json.loads(index_file.read())
    (entry,) = index["manifests"]
    manifest = blob(archive, entry["digest"])
    return entry, blob(archive, manifest["config"]["digest"])  # type: ignore[index]


def test_the_image_takes_the_dockerfiles_entrypoint_user_port_and_environment(agent_image: BuiltImage) -> None:
    final = Dockerfile.read().final
    entry, config = image_config(agent_image.archive)
    settings = config["config"]
    assert isinstance(settings, dict)
    assert settings["Entrypoint"] == final.entrypoint == ["prewarm-agent"]
    assert settings["User"] == final.user == "0:0"
    assert sorted(settings["ExposedPorts"]) == final.exposed == ["9102/tcp"]
    assert dict(e.split("=", 1) for e in settings["Env"]) == {**BASE_ENV, **final.env}
    assert "Cmd" not in settings or not settings["Cmd"]
    assert (config["os"], config["architecture"]) == ("linux", agent_image.architecture)
    # Tagged with the package version, under the name containerd gives it on import
    assert agent_image.reference == f"prewarm-agent:{package_version()}"
    assert entry["annotations"]["io.containerd.image.name"] == containerd_name(agent_image.reference)
    print(f"\n{agent_image.reference} {agent_image.architecture}: {agent_image.layer_bytes / 1e6:.1f} MB compressed, "
          f"{agent_image.unpacked_bytes / 1e6:.1f} MB unpacked, Python {agent_image.python}")


def test_the_image_holds_no_compiler_pip_cache_or_lambda_only_packages(agent_image: BuiltImage) -> None:
    with tarfile.open(agent_image.archive) as tar:
        (layer,) = [m for m in tar.getmembers() if m.name.startswith("blobs/") and m.size > 4096]
        layer_file = tar.extractfile(layer)
        assert layer_file is not None
        with tarfile.open(fileobj=layer_file, mode="r:gz") as files:
            names = files.getnames()
    compilers = re.compile(r"(^|/)bin/(gcc|cc|g\+\+|c\+\+|clang|make|ld)(-[\d.]+)?$")
    assert not [n for n in names if compilers.search(n)]
    assert not [n for n in names if "/.cache/pip" in n or n.startswith("wheels/")]
    site = f"usr/local/lib/python{agent_image.python}/dist-packages/"
    installed = {n[len(site):].split("/")[0] for n in names if n.startswith(site)}
    assert {"prewarm", "prewarm_agent", "grpc", "boto3", "pydantic"} <= installed
    # The control plane's own packages stay out of the agent's image
    assert not installed & {"kubernetes", "aws_lambda_powertools", "prewarm_cli", "prewarm_devtools"}


def test_the_agent_runs_from_the_image_on_the_dockerfiles_python(agent_image: BuiltImage, tmp_path: Path) -> None:
    # Given an image whose Python is the one agent/Dockerfile's base has (python:3.13-slim: 3.13)
    assert agent_image.python == Dockerfile.read().python
    # Given the image imported into a node's containerd
    with PrivateContainerd(Path(f"/tmp/pwi-{tmp_path.name[-8:]}")) as containerd:
        def ctr(*args: str) -> subprocess.CompletedProcess[str]:
            address = str(containerd.socket_path)
            return subprocess.run([containerd.ctr, "--address", address, "--namespace", "k8s.io", *args],
                                  capture_output=True, text=True, timeout=120, check=False)

        assert ctr("images", "import", str(agent_image.archive)).returncode == 0
        name = containerd_name(agent_image.reference)
        # When its entrypoint runs with no settings, read-only and without capabilities
        # (a foreign architecture's runs under qemu-user-static through binfmt_misc)
        platform = f"--platform=linux/{agent_image.architecture}"
        run = ctr("run", "--rm", platform, "--read-only", "--cap-drop=CAP_CHOWN", name, "bare")
        # Then the agent itself answers, naming every setting it lacks
        assert run.returncode == 2, run.stderr
        assert "invalid agent environment: NODE_NAME: Field required" in run.stdout + run.stderr
        # ... on the Dockerfile's Python, with its compiled dependencies importable
        probe = ctr("run", "--rm", platform, "--read-only", name, "probe", "python3", "-c",
                    "import sys, platform, grpc, google.protobuf, pydantic_core, prewarm_agent.agent; "
                    "print(sys.version_info[:2], platform.machine())")
        assert probe.returncode == 0, probe.stderr
        machine = {"amd64": "x86_64", "arm64": "aarch64"}[agent_image.architecture]
        assert probe.stdout.strip() == f"{tuple(int(p) for p in Dockerfile.read().python.split('.'))} {machine}"
