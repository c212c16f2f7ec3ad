"""The startup taint's pure parts: which images a node must have, the patch that removes the taint,
and the messages that carry the list."""

from __future__ import annotations

import json
from typing import Any

import pytest

from prewarm.domain.kubernetes import LabelSelector
from prewarm.domain.messages import (
    Hello,
    MessageError,
    RequiredImage,
    RequiredImages,
    Warmed,
    parse_agent_message,
    parse_node_message,
)
from prewarm.domain.placement import NodeSelector, Placement, Platform
from prewarm.domain.warming import NeverJob, StartupTaint, missing_summary, parse_taint, required_images

AMD64 = {"kubernetes.io/os": "linux", "kubernetes.io/arch": "amd64"}
WARMING = {"key": "prewarm.dev/warming", "value": "true", "effect": "NoSchedule"}


def node(name: str = "n1", ready: str = "True", taints: list[dict[str, str]] | None = None,
         **labels: str) -> dict[str, Any]:
    return {"metadata": {"name": name, "labels": {**AMD64, **labels}},
            "spec": {"taints": taints} if taints is not None else {},
            "status": {"conditions": [{"type": "Ready", "status": ready}]}}


def job(key: str, image: str, *, pool: str | None = None, pods: dict[str, str] | None = None,
        platforms: tuple[Platform, ...] | None = None) -> NeverJob:
    selector = NodeSelector(match_labels={"pool": pool}) if pool else None
    pod_selector = LabelSelector(match_labels=pods) if pods else None
    return NeverJob(key, image, Placement(selector, pod_selector, key.split("/")[0]), platforms)


def test_a_node_needs_the_images_of_the_never_jobs_that_select_it_once_each_sorted() -> None:
    jobs = [job("default/b", "r.io/b:1", pool="gpu"), job("default/a", "r.io/a:1"),
            job("default/c", "r.io/c:1", pool="cpu"), job("default/a2", "r.io/a:1")]

    wanted = required_images(jobs, node(pool="gpu"))

    assert wanted == [RequiredImage(image="r.io/a:1", job="default/a"),
                      RequiredImage(image="r.io/a:1", job="default/a2"),
                      RequiredImage(image="r.io/b:1", job="default/b")]


def test_a_node_a_job_excludes_needs_nothing_from_it() -> None:
    arm_only = job("default/arm", "r.io/arm:1", platforms=(Platform("linux", "arm64"),))

    assert required_images([arm_only], node()) == []
    assert required_images([job("default/a", "r.io/a:1")], node(ready="False")) == []
    assert required_images([job("default/vk", "r.io/a:1")], node(type="virtual-kubelet")) == []


def test_a_pod_selector_job_needs_its_pods_on_the_node() -> None:
    by_pods = job("shop/web", "r.io/web:1", pods={"app": "web"})
    pod = {"metadata": {"name": "p", "namespace": "shop", "labels": {"app": "web"}},
           "spec": {"nodeName": "n1"}, "status": {"phase": "Running"}}

    assert required_images([by_pods], node()) == []
    assert required_images([by_pods], node(), {"shop/web": [pod]}) == [RequiredImage(image="r.io/web:1",
                                                                                    job="shop/web")]


def test_the_removal_patch_tests_and_removes_only_the_startup_taint() -> None:
    other = {"key": "gpu", "value": "true", "effect": "NoSchedule"}
    noexecute = {**WARMING, "effect": "NoExecute"}

    patch = StartupTaint().removal_patch(node(taints=[other, WARMING, noexecute]))

    assert patch == [{"op": "test", "path": "/spec/taints/1", "value": WARMING},
                     {"op": "remove", "path": "/spec/taints/1"}]
    assert StartupTaint().removal_patch(node(taints=[other])) is None
    assert StartupTaint().removal_patch(node()) is None
    assert StartupTaint().held_by(node(taints=[WARMING])) and not StartupTaint().held_by(node(taints=[noexecute]))


def test_taints_are_read_as_kubectl_and_karpenter_write_them() -> None:
    assert parse_taint("prewarm.dev/warming=true:NoSchedule") == StartupTaint("prewarm.dev/warming", "NoSchedule")
    assert parse_taint("warming:NoExecute") == StartupTaint("warming", "NoExecute")
    with pytest.raises(ValueError, match="Effect one of"):
        parse_taint("prewarm.dev/warming=true:Sometimes")


def test_the_missing_images_fit_an_events_message_and_say_how_many_were_left_out() -> None:
    missing = {f"r.io/image-{i:03d}:1": "pull failed: 404 Not Found" for i in range(40)}

    text = missing_summary(missing)

    assert len(text) <= 900 + len("; and 40 more")
    assert text.startswith("r.io/image-000:1 (pull failed: 404 Not Found); r.io/image-001:1")
    assert text.endswith(" more") and str(40 - text.count("(pull failed")) in text.rsplit(";", 1)[1]
    assert missing_summary({"r.io/a:1": "no pull task received"}) == "r.io/a:1 (no pull task received)"


def test_required_images_travel_on_the_node_queue() -> None:
    message = RequiredImages(node="n1", as_of=1700000000.5, images=[RequiredImage(image="r.io/a:1", job="d/a")])

    parsed = parse_node_message(message.model_dump_json())

    assert parsed == message
    assert json.loads(message.model_dump_json())["kind"] == "required"
    missing_job = {"v": 1, "kind": "required", "node": "n1", "as_of": 1, "images": [{"image": "x"}]}
    with pytest.raises(MessageError, match=r"images\.0\.job"):
        parse_node_message(json.dumps(missing_job))
    with pytest.raises(MessageError, match="as_of"):
        parse_node_message(json.dumps({"v": 1, "kind": "required", "node": "n1", "images": []}))


def test_a_hello_says_warm_until_only_when_the_node_holds_the_taint() -> None:
    # Older control planes refuse unknown fields: an untainted node's hello must look as it always did.
    plain, warming = Hello(node="n1"), Hello(node="n1", warm_until=1700000900.0)

    assert "warm_until" not in json.loads(plain.model_dump_json())
    assert parse_agent_message(warming.model_dump_json()) == warming
    assert parse_agent_message(json.dumps({"v": 1, "kind": "hello", "node": "n1"})) == plain


def test_a_warm_up_travels_on_the_status_queue_and_names_at_most_20_missing_images() -> None:
    warmed = Warmed(node="n1", joined_at=1700000000, hello_at=1700000008.25, warm_at=1700000050, outcome="timeout",
                    missing=["r.io/a:1"], missing_total=1)

    assert parse_agent_message(warmed.model_dump_json()) == warmed
    body = json.loads(warmed.model_dump_json())
    with pytest.raises(MessageError, match=r"missing: List should have at most 20 items"):
        parse_agent_message(json.dumps({**body, "missing": [f"r.io/{i}:1" for i in range(21)]}))
    with pytest.raises(MessageError, match=r"outcome"):
        parse_agent_message(json.dumps({**body, "outcome": "lukewarm"}))
    with pytest.raises(MessageError, match=r"warm_at"):
        parse_agent_message(json.dumps({**body, "warm_at": -1}))
