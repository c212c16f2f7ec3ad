"""The agent's own Node: labels, architecture and OS for the hello, read with one HTTPS GET; and the
two writes of the startup taint: removing it from that Node, and an Event on it when it was removed
before the node was warm.

The agent's service account may `get` and `patch` nodes and `create` events in `default`; this module
touches its own node only (and the admission policy of `prewarm install` refuses anything else). It
does not use the `kubernetes` package (an import-linter contract keeps it out of the agent): the
pod's projected token is re-read on every call, as it rotates.
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

from prewarm.domain.kubernetes import parse_time

log = logging.getLogger(__name__)

# Go's GOARCH names, which Kubernetes and image platforms use.
GO_ARCHITECTURES = {"x86_64": "amd64", "amd64": "amd64", "aarch64": "arm64", "arm64": "arm64",
                    "armv7l": "arm", "armv6l": "arm", "i386": "386", "i686": "386", "ppc64le": "ppc64le",
                    "s390x": "s390x", "riscv64": "riscv64"}


class NodeReadError(Exception):
    """The Node object could not be read (or written); the message says which endpoint and why.

    `status` is the HTTP status when the API answered (422: a patch's `test` failed, the Node changed).
    """

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


@dataclass(frozen=True)
class NodeFacts:
    """What the hello says about the node. `from_api` is False when it was guessed locally."""

    name: str
    labels: Mapping[str, str] = field(default_factory=dict)
    architecture: str = ""
    os: str = "linux"
    from_api: bool = False
    taints: tuple[Mapping[str, str], ...] = ()
    created_at: float | None = None  # when the node joined (metadata.creationTimestamp)


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
    return _call(access, "GET", f"/api/v1/nodes/{urllib.parse.quote(name, safe='')}")


def patch_node(name: str, access: KubeApiAccess, ops: list[dict[str, Any]]) -> dict[str, Any]:
    """A JSON patch (`application/json-patch+json`) of the node; `NodeReadError` (status 422 when a `test` failed)."""
    return _call(access, "PATCH", f"/api/v1/nodes/{urllib.parse.quote(name, safe='')}", ops,
                 content_type="application/json-patch+json")


def create_event(access: KubeApiAccess, event: dict[str, Any]) -> dict[str, Any]:
    """POST a core/v1 Event into its namespace (a Node's go to `default`)."""
    namespace = urllib.parse.quote(str(event["metadata"]["namespace"]), safe="")
    return _call(access, "POST", f"/api/v1/namespaces/{namespace}/events", event)


_HINTS = {
    "GET": " (the agent's ClusterRole must allow get on nodes)",
    "PATCH": " (the agent's ClusterRole must allow patch on nodes, and the admission policy "
             "prewarm-agent-startup-taint lets it remove only the startup taint of its own node)",
    "POST": " (the agent's Role in namespace default must allow create on events)",
}


def _call(access: KubeApiAccess, method: str, path: str, body: Any = None,
          content_type: str = "application/json") -> dict[str, Any]:
    if not access.endpoint:
        raise NodeReadError("no Kubernetes API endpoint (KUBE_API_ENDPOINT or KUBERNETES_SERVICE_HOST)")
    url = f"{access.endpoint.rstrip('/')}{path}"
    headers = {"Accept": "application/json"}
    if token := access.bearer_token():
        headers["Authorization"] = f"Bearer {token}"
    data = None
    if body is not None:
        data = json.dumps(body).encode()
        headers["Content-Type"] = content_type
    request = urllib.request.Request(url, data=data, headers=headers, method=method)
    try:
        with urllib.request.urlopen(request, timeout=access.timeout, context=access.ssl_context()) as response:
            document: dict[str, Any] = json.loads(response.read())
            return document
    except urllib.error.HTTPError as e:
        hint = _HINTS[method] if e.code == 403 else ""
        detail = _status_message(e)
        raise NodeReadError(f"{method} {url} answered {e.code} {e.reason}{hint}{detail}", e.code) from None
    except (OSError, ValueError) as e:
        raise NodeReadError(f"{method} {url} failed: {getattr(e, 'reason', e)}") from e


def _status_message(error: urllib.error.HTTPError) -> str:
    """The API's own words from its Status body (an admission policy's message), when it sent one."""
    try:
        message = json.loads(error.read()).get("message")
    except (OSError, ValueError, AttributeError):
        return ""
    return f": {message}" if message else ""


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
    taints = tuple(t for t in (node.get("spec") or {}).get("taints") or () if isinstance(t, Mapping))
    return NodeFacts(name=name, labels=labels, architecture=str(arch), os=str(os_name), from_api=True,
                     taints=taints, created_at=parse_time(metadata.get("creationTimestamp")))
