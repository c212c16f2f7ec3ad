"""The agent's own Node: labels, architecture and OS for the hello, read with one HTTPS GET.

The agent's service account may only `get` nodes, and this module asks for its own node only. It does
not use the `kubernetes` package (an import-linter contract keeps it out of the agent): the pod's
projected token is re-read on every call, as it rotates.
"""

from __future__ import annotations

import json
import logging
import platform
import ssl
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

# Go's GOARCH names, which Kubernetes and image platforms use.
GO_ARCHITECTURES = {"x86_64": "amd64", "amd64": "amd64", "aarch64": "arm64", "arm64": "arm64",
                    "armv7l": "arm", "armv6l": "arm", "i386": "386", "i686": "386", "ppc64le": "ppc64le",
                    "s390x": "s390x", "riscv64": "riscv64"}


class NodeReadError(Exception):
    """The Node object could not be read; the message says which endpoint and why."""


@dataclass(frozen=True)
class NodeFacts:
    """What the hello says about the node. `from_api` is False when it was guessed locally."""

    name: str
    labels: Mapping[str, str] = field(default_factory=dict)
    architecture: str = ""
    os: str = "linux"
    from_api: bool = False


def local_architecture() -> str:
    """This machine's architecture in Kubernetes (Go) terms, from `platform.machine()`."""
    machine = platform.machine().lower()
    return GO_ARCHITECTURES.get(machine, machine)


@dataclass(frozen=True)
class KubeApiAccess:
    """How to reach the Kubernetes API: endpoint, and a bearer token (given, or read from a file)."""

    endpoint: str
    token: str = field(default="", repr=False)
    token_file: str = ""
    ca_file: str = ""
    timeout: float = 5.0

    def bearer_token(self) -> str:
        if self.token:
            return self.token
        if self.token_file:
            try:
                return Path(self.token_file).read_text(encoding="utf-8").strip()
            except OSError as e:
                raise NodeReadError(f"cannot read the service account token {self.token_file}: {e.strerror}") from e
        return ""

    def ssl_context(self) -> ssl.SSLContext | None:
        if not self.endpoint.startswith("https://"):
            return None
        if self.ca_file and Path(self.ca_file).is_file():
            return ssl.create_default_context(cafile=self.ca_file)
        return ssl.create_default_context()


def read_node(name: str, access: KubeApiAccess) -> dict[str, Any]:
    """GET `/api/v1/nodes/<name>`; raises `NodeReadError` naming the endpoint and the reason."""
    if not access.endpoint:
        raise NodeReadError("no Kubernetes API endpoint (KUBE_API_ENDPOINT or KUBERNETES_SERVICE_HOST)")
    url = f"{access.endpoint.rstrip('/')}/api/v1/nodes/{urllib.parse.quote(name, safe='')}"
    headers = {"Accept": "application/json"}
    if token := access.bearer_token():
        headers["Authorization"] = f"Bearer {token}"
    request = urllib.request.Request(url, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=access.timeout, context=access.ssl_context()) as response:
            document: dict[str, Any] = json.loads(response.read())
            return document
    except urllib.error.HTTPError as e:
        hint = " (the agent's ClusterRole must allow get on nodes)" if e.code == 403 else ""
        raise NodeReadError(f"GET {url} answered {e.code} {e.reason}{hint}") from None
    except (OSError, ValueError) as e:
        raise NodeReadError(f"GET {url} failed: {getattr(e, 'reason', e)}") from e


def node_facts(name: str, access: KubeApiAccess) -> NodeFacts:
    """The node's labels, architecture and OS from its Node object, or local guesses when unreachable."""
    try:
        node = read_node(name, access)
    except NodeReadError as e:
        arch = local_architecture()
        log.warning(
            "cannot read node %s from the Kubernetes API (%s); sending the hello without labels and with "
            "architecture %s from platform.machine()",
            name, e, arch, extra={"node": name},
        )
        return NodeFacts(name=name, architecture=arch, os=platform.system().lower() or "linux")
    metadata = node.get("metadata") or {}
    info = (node.get("status") or {}).get("nodeInfo") or {}
    labels = {str(k): str(v) for k, v in (metadata.get("labels") or {}).items()}
    arch = info.get("architecture") or labels.get("kubernetes.io/arch") or local_architecture()
    os_name = info.get("operatingSystem") or labels.get("kubernetes.io/os") or "linux"
    return NodeFacts(name=name, labels=labels, architecture=str(arch), os=str(os_name), from_api=True)
