"""The hello's facts about the node: its own Node object, or local guesses when the API is out of reach."""

from __future__ import annotations

import json
import logging
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from prewarm_agent import node as node_module
from prewarm_agent.node import KubeApiAccess, NodeReadError, local_architecture, node_facts, read_node

NODE = {
    "metadata": {"name": "ip-10-0-1-5", "labels": {"kubernetes.io/arch": "arm64", "team": "ml"}},
    "status": {"nodeInfo": {"architecture": "arm64", "operatingSystem": "linux"}},
}


def test_facts_come_from_the_node_object(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(node_module, "read_node", lambda name, access: NODE)

    facts = node_facts("ip-10-0-1-5", KubeApiAccess(endpoint="https://10.100.0.1"))

    assert (facts.labels, facts.architecture, facts.os, facts.from_api) == (
        {"kubernetes.io/arch": "arm64", "team": "ml"}, "arm64", "linux", True
    )


def test_an_unreachable_api_falls_back_to_this_machine_and_says_so(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    def unreachable(name: str, access: KubeApiAccess) -> dict[str, Any]:
        raise NodeReadError("GET https://10.100.0.1/api/v1/nodes/n failed: connection refused")

    monkeypatch.setattr(node_module, "read_node", unreachable)

    facts = node_facts("n", KubeApiAccess(endpoint="https://10.100.0.1"))

    assert (facts.labels, facts.architecture, facts.from_api) == ({}, local_architecture(), False)
    (warning,) = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert "connection refused" in warning.getMessage()
    assert "platform.machine()" in warning.getMessage()


def test_no_endpoint_is_a_read_error_naming_the_settings() -> None:
    with pytest.raises(NodeReadError, match="KUBE_API_ENDPOINT or KUBERNETES_SERVICE_HOST"):
        read_node("n", KubeApiAccess(endpoint=""))


def test_the_token_is_read_from_its_file_on_every_call(tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_text("first\n", encoding="utf-8")
    access = KubeApiAccess(endpoint="https://x", token_file=str(token))

    first = access.bearer_token()
    token.write_text("rotated", encoding="utf-8")

    assert (first, access.bearer_token()) == ("first", "rotated")


def test_a_missing_token_file_names_it(tmp_path: Path) -> None:
    with pytest.raises(NodeReadError, match=r"cannot read the service account token .*missing"):
        KubeApiAccess(endpoint="https://x", token_file=str(tmp_path / "missing")).bearer_token()


def test_plain_http_endpoints_use_no_tls_context() -> None:
    assert KubeApiAccess(endpoint="http://127.0.0.1:8080").ssl_context() is None
    assert KubeApiAccess(endpoint="https://x", ca_file="/nonexistent/ca.crt").ssl_context() is not None


def test_the_node_object_is_read_with_the_bearer_token(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: dict[str, Any] = {}

    class Response:
        def __enter__(self) -> Response:
            return self

        def __exit__(self, *exc: object) -> None:
            return None

        def read(self) -> bytes:
            return json.dumps(NODE).encode()

    def urlopen(request: Any, timeout: float, context: Any) -> Response:
        seen.update(url=request.full_url, auth=request.get_header("Authorization"), timeout=timeout)
        return Response()

    monkeypatch.setattr(urllib.request, "urlopen", urlopen)

    assert read_node("ip-10-0-1-5.ec2.internal", KubeApiAccess(endpoint="https://api/", token="t0k")) == NODE
    assert seen == {"url": "https://api/api/v1/nodes/ip-10-0-1-5.ec2.internal", "auth": "Bearer t0k", "timeout": 5.0}
