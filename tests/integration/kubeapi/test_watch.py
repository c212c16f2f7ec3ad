"""Watches through `kubernetes.watch.Watch`: events from a resourceVersion, initial ADDED events,
selectors, bookmarks, timeouts, expiry (410) and the end of the stream when the server stops."""

# The typed client declares every field optional and takes models, not dicts: these tests pass
# the API's JSON and read fields they just asserted exist.
# mypy: disable-error-code="union-attr, arg-type, misc, index, operator, attr-defined, no-untyped-call"

from __future__ import annotations

import json
import threading
import time
from typing import Any

import pytest
from kubernetes import watch
from kubernetes.client import ApiClient, ApiException, CoreV1Api

from prewarm_devtools.kubeapi import KubeApiServer
from tests.support.kube import node, pod

pytestmark = pytest.mark.integration


def events(stream_of: Any, count: int, **kwargs: Any) -> list[tuple[str, str]]:
    """The first `count` events of a watch, as (type, name)."""
    w = watch.Watch()
    seen: list[tuple[str, str]] = []
    for event in w.stream(stream_of, timeout_seconds=10, **kwargs):
        obj = event["object"]
        name = obj["metadata"].get("name", "") if isinstance(obj, dict) else obj.metadata.name
        seen.append((event["type"], name))
        if len(seen) == count:
            w.stop()
    return seen


def test_watch_from_a_resource_version_streams_added_modified_deleted(core_v1: CoreV1Api) -> None:
    # Given the resourceVersion of a list
    core_v1.create_node(node("before"))
    rv = core_v1.list_node().metadata.resource_version
    # When a node is created, changed and deleted
    core_v1.create_node(node("n1"))
    core_v1.patch_node("n1", {"metadata": {"labels": {"a": "b"}}})
    core_v1.delete_node("n1")
    # Then a watch from that version sees the three events, in order, and nothing older
    assert events(core_v1.list_node, 3, resource_version=rv) == [("ADDED", "n1"), ("MODIFIED", "n1"), ("DELETED", "n1")]


def test_watch_events_carry_typed_objects_and_increasing_versions(core_v1: CoreV1Api) -> None:
    rv = core_v1.list_node().metadata.resource_version
    for name in ("n1", "n2"):
        core_v1.create_node(node(name))
    w = watch.Watch()
    versions = []
    for event in w.stream(core_v1.list_node, resource_version=rv, timeout_seconds=10):
        versions.append(int(event["object"].metadata.resource_version))
        assert event["raw_object"]["kind"] == "Node"
        if len(versions) == 2:
            w.stop()
    assert versions[0] < versions[1] and versions[0] > int(rv)


def test_watch_without_a_resource_version_starts_with_the_existing_objects(core_v1: CoreV1Api) -> None:
    core_v1.create_node(node("a"))
    core_v1.create_node(node("b"))
    assert events(core_v1.list_node, 2) == [("ADDED", "a"), ("ADDED", "b")]


def test_watch_with_a_selector_sees_objects_enter_and_leave_it(core_v1: CoreV1Api) -> None:
    core_v1.create_node(node("n1", {"tier": "web"}))
    rv = core_v1.list_node().metadata.resource_version
    core_v1.patch_node("n1", {"metadata": {"labels": {"tier": "db"}}})
    core_v1.create_node(node("n2", {"tier": "db"}))
    core_v1.patch_node("n1", {"metadata": {"labels": {"tier": "web"}}})
    assert events(core_v1.list_node, 2, resource_version=rv, label_selector="tier=web") == [
        ("DELETED", "n1"),
        ("ADDED", "n1"),
    ]


def test_namespaced_pod_watch_sees_only_its_namespace(core_v1: CoreV1Api, kube_api: KubeApiServer) -> None:
    rv = core_v1.list_namespaced_pod("default").metadata.resource_version
    kube_api.seed_objects([pod("other-1", "elsewhere"), pod("mine-1", "default")])
    assert events(core_v1.list_namespaced_pod, 1, namespace="default", resource_version=rv) == [("ADDED", "mine-1")]


def test_watch_ends_after_timeout_seconds(core_v1: CoreV1Api) -> None:
    rv = core_v1.list_node().metadata.resource_version
    started = time.monotonic()
    seen = list(watch.Watch().stream(core_v1.list_node, resource_version=rv, timeout_seconds=1))
    assert seen == []
    assert 0.9 <= time.monotonic() - started < 5


def test_watch_from_a_version_older_than_the_log_is_410() -> None:
    # Given a server that keeps only the last few events
    with KubeApiServer(max_events=10) as api, api.api_client() as client:
        v1 = CoreV1Api(client)
        for i in range(30):
            v1.create_node(node(f"n{i}"))
        # When watching from the beginning, Then the client raises the 410 Expired error
        with pytest.raises(ApiException) as raised:
            list(watch.Watch().stream(v1.list_node, resource_version="2", timeout_seconds=5))
        assert raised.value.status == 410
        assert "too old resource version" in str(raised.value.reason)


def test_bookmarks_report_progress_when_asked_for() -> None:
    with KubeApiServer(bookmark_interval=0.2) as api, api.api_client() as client:
        v1 = CoreV1Api(client)
        rv = v1.list_node().metadata.resource_version
        w = watch.Watch()
        for event in w.stream(v1.list_node, resource_version=rv, allow_watch_bookmarks=True, timeout_seconds=5):
            assert event["type"] == "BOOKMARK"
            assert int(event["raw_object"]["metadata"]["resourceVersion"]) >= int(rv)
            w.stop()
        assert w.resource_version is not None


def test_send_initial_events_ends_with_an_annotated_bookmark(core_v1: CoreV1Api) -> None:
    core_v1.create_node(node("a"))
    w = watch.Watch()
    seen = []
    for event in w.stream(
        core_v1.list_node,
        send_initial_events=True,
        resource_version_match="NotOlderThan",
        allow_watch_bookmarks=True,
        timeout_seconds=5,
    ):
        seen.append(event["type"])
        if event["type"] == "BOOKMARK":
            assert event["raw_object"]["metadata"]["annotations"] == {"k8s.io/initial-events-end": "true"}
            w.stop()
    assert seen == ["ADDED", "BOOKMARK"]


def test_an_unchanged_replace_keeps_the_resource_version_and_sends_no_event(
    core_v1: CoreV1Api, kube_api: KubeApiServer
) -> None:
    # Given a node whose status holds times (the typed client writes them back as "+00:00", the server's
    # metav1.Time as UTC "Z": the same times)
    heartbeat = {"type": "Ready", "status": "True", "lastHeartbeatTime": "2026-01-01T00:00:00Z",
                 "lastTransitionTime": "2026-01-01T00:00:00Z"}
    core_v1.create_node(node("n1"))
    core_v1.patch_node_status("n1", {"status": {"conditions": [heartbeat]}})
    rv = core_v1.read_node("n1").metadata.resource_version
    # When the node and its status are replaced by what was read, unchanged
    assert core_v1.replace_node_status("n1", core_v1.read_node("n1")).metadata.resource_version == rv
    assert core_v1.replace_node("n1", core_v1.read_node("n1")).metadata.resource_version == rv
    # Then nothing was written: the resourceVersion stays, the times keep the server's spelling, and a
    # watch from that version sees only the next real change
    assert kube_api.resource_version == int(rv)
    assert kube_api.get_object("nodes", "n1")["status"]["conditions"] == [heartbeat]
    core_v1.patch_node("n1", {"metadata": {"labels": {"a": "b"}}})
    assert events(core_v1.list_node, 1, resource_version=rv) == [("MODIFIED", "n1")]
    assert kube_api.resource_version == int(rv) + 1


def test_stopping_the_server_ends_open_watches() -> None:
    api = KubeApiServer()
    api.seed_objects([node("n1")])
    api.start()
    client = ApiClient(api.client_configuration())
    lines: list[bytes] = []
    response = CoreV1Api(client).list_node(watch=True, _preload_content=False)

    def read() -> None:
        for chunk in response.stream(amt=None, decode_content=False):
            lines.append(chunk)

    reader = threading.Thread(target=read)
    reader.start()
    api.stop()
    reader.join(timeout=5)
    client.close()
    assert not reader.is_alive()
    received = [json.loads(line) for line in b"".join(lines).splitlines() if line]
    assert [(e["type"], e["object"]["metadata"]["name"]) for e in received] == [("ADDED", "n1")]
