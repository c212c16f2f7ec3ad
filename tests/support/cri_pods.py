"""A container running on a local node's containerd as the kubelet runs a pod's: CRI `RunPodSandbox` (the
node's network, so no CNI), `CreateContainer`, `StartContainer`; and the images that takes, built here: a
static `pause` binary (compiled with the host's gcc) as the sandbox image and as a runnable image of a test's
own. The stubs are generated from cri_pods.proto at first use (grpcio-tools, a dev dependency).
"""

from __future__ import annotations

import gzip
import importlib.util
import io
import json
import shutil
import subprocess
import sys
import tarfile
import tempfile
import uuid
from dataclasses import replace
from functools import cache
from pathlib import Path
from types import ModuleType
from typing import Any

import grpc

from prewarm_agent.cri.gen import cri_runtime_v1_pb2 as cri_pb2
from prewarm_devtools.node.images import (
    OCI_CONFIG,
    OCI_LAYER_GZIP,
    OCI_MANIFEST,
    Blob,
    Layer,
    OciImage,
    RegistryPusher,
    build_image,
    sha256_digest,
)

PROTO = Path(__file__).with_name("cri_pods.proto")
# The sandbox image the local nodes' containerd is configured with (prewarm_devtools.node.containerd).
SANDBOX_IMAGE = "registry.k8s.io/pause:3.6"
_PAUSE_C = b"""#include <signal.h>
#include <unistd.h>
static void done(int s) { (void)s; _exit(0); }
int main(void) { signal(SIGTERM, done); signal(SIGINT, done); for (;;) pause(); }
"""


def missing_tools() -> str:
    """Why a pod cannot run here ("" when it can)."""
    return "" if shutil.which("gcc") else "no gcc to build the static pause binary"


@cache
def _stubs() -> ModuleType:
    from grpc_tools import protoc

    from prewarm_agent.cri.regenerate import PROTO_DIR

    out = Path(tempfile.mkdtemp(prefix="cri-pods-"))
    if protoc.main(["protoc", f"-I{PROTO.parent}", f"-I{PROTO_DIR}", f"--python_out={out}", PROTO.name]) != 0:
        raise RuntimeError(f"protoc refused {PROTO}")
    # The generated module imports the agent's messages as a top-level module: they are the agent's own.
    sys.modules.setdefault("cri_runtime_v1_pb2", cri_pb2)
    spec = importlib.util.spec_from_file_location("cri_pods_pb2", out / "cri_pods_pb2.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@cache
def pause_binary() -> bytes:
    """A static binary that sleeps until SIGTERM, as the pause container's."""
    work = Path(tempfile.mkdtemp(prefix="pause-"))
    (work / "pause.c").write_bytes(_PAUSE_C)
    subprocess.run(["gcc", "-static", "-Os", "-o", str(work / "pause"), str(work / "pause.c")], check=True)
    return (work / "pause").read_bytes()


def runnable_layer() -> Layer:
    """One layer holding `/pause`, executable."""
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.PAX_FORMAT) as tar:
        binary = pause_binary()
        info = tarfile.TarInfo("pause")
        info.size, info.mode = len(binary), 0o755
        tar.addfile(info, io.BytesIO(binary))
    data = raw.getvalue()
    return Layer(blob=Blob(OCI_LAYER_GZIP, gzip.compress(data, mtime=0)), diff_id=sha256_digest(data))


def runnable_image() -> OciImage:
    """An image whose entrypoint is `/pause` (each call's config is its own, so each is another image)."""
    base = build_image(layers=[runnable_layer()])
    config = json.loads(base.config.data)
    config["config"] = {**config["config"], "Entrypoint": ["/pause"], "Cmd": []}
    config_blob = Blob(OCI_CONFIG, json.dumps(config, sort_keys=True).encode())
    manifest = json.loads(base.manifest.data)
    manifest["config"] = config_blob.descriptor()
    return replace(base, config=config_blob, manifest=Blob(OCI_MANIFEST, json.dumps(manifest, sort_keys=True).encode()))


def install_sandbox_image(containerd: Any, pusher: RegistryPusher, host: str,
                          auth: tuple[str, str] | None = None) -> None:
    """Gives `containerd` its sandbox (pause) image, as a node has it: pushed with `pusher`, pulled through the
    CRI from `host` (the registry's name for containerd), and named as containerd's config wants it."""
    pusher.push_image("pods/pause", "3.6", runnable_image())
    reference = f"{host}/pods/pause:3.6"
    with containerd.cri_client() as cri:
        cri.pull_image(reference, auth=auth, timeout=60).result()
    subprocess.run([containerd.ctr, "--address", str(containerd.socket_path), "-n", "k8s.io", "images", "tag",
                    "--force", reference, SANDBOX_IMAGE], check=True, capture_output=True)


class CriPods:
    """Pods on one containerd through its CRI socket, as the kubelet makes them."""

    def __init__(self, socket_path: str | Path, log_dir: Path) -> None:
        self._channel = grpc.insecure_channel(f"unix://{socket_path}")
        self.log_dir = log_dir
        self.sandboxes: list[str] = []
        pb = self.pb = _stubs()
        self._run = self._call("RunPodSandbox", pb.RunPodSandboxRequest, pb.RunPodSandboxResponse)
        self._stop = self._call("StopPodSandbox", pb.PodSandboxIdRequest, pb.Empty)
        self._remove = self._call("RemovePodSandbox", pb.PodSandboxIdRequest, pb.Empty)
        self._create = self._call("CreateContainer", pb.CreateContainerRequest, pb.CreateContainerResponse)
        self._start = self._call("StartContainer", pb.StartContainerRequest, pb.Empty)

    def _call(self, method: str, request: Any, response: Any) -> Any:
        return self._channel.unary_unary(f"/runtime.v1.RuntimeService/{method}",
                                         request_serializer=request.SerializeToString,
                                         response_deserializer=response.FromString)

    def run(self, image: str, name: str = "") -> tuple[str, str]:
        """A pod (on the node's network) with one container of `image` running `/pause`: (sandbox, container)."""
        pb, name = self.pb, name or f"pod-{uuid.uuid4().hex[:8]}"
        sandbox = pb.PodSandboxConfig(
            metadata=cri_pb2.PodSandboxMetadata(name=name, uid=uuid.uuid4().hex, namespace="default"),
            log_directory=str(self.log_dir / name),
            linux=pb.LinuxPodSandboxConfig(security_context=pb.LinuxSandboxSecurityContext(
                namespace_options=pb.NamespaceOption(network=pb.NODE, pid=pb.CONTAINER))))
        sandbox_id = self._run(pb.RunPodSandboxRequest(config=sandbox), timeout=60).pod_sandbox_id
        self.sandboxes.append(sandbox_id)
        config = pb.ContainerConfig(metadata=cri_pb2.ContainerMetadata(name="main"),
                                    image=cri_pb2.ImageSpec(image=image), command=["/pause"], log_path="main.log")
        container = self._create(pb.CreateContainerRequest(pod_sandbox_id=sandbox_id, config=config,
                                                           sandbox_config=sandbox), timeout=60).container_id
        self._start(pb.StartContainerRequest(container_id=container), timeout=60)
        return sandbox_id, container

    def remove(self, sandbox_id: str) -> None:
        """Stops and removes the pod and its containers, as the kubelet does when a pod goes."""
        self._stop(self.pb.PodSandboxIdRequest(pod_sandbox_id=sandbox_id), timeout=60)
        self._remove(self.pb.PodSandboxIdRequest(pod_sandbox_id=sandbox_id), timeout=60)
        self.sandboxes.remove(sandbox_id)

    def close(self) -> None:
        for sandbox_id in list(self.sandboxes):
            self.remove(sandbox_id)
        self._channel.close()
