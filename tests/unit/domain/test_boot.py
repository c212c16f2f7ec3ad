"""The rules of warm at boot (`prewarm.domain.boot`): which required images a hello's digests hold, when a
hello is a node's first, and the `PrewarmWarm` condition each step of a warm-up sets."""

from __future__ import annotations

import pytest

from prewarm.domain.boot import (
    CONDITION_TYPE,
    FAILED,
    NODE_LABEL_VALUE,
    NONE_REQUIRED,
    PRESENT_AT_BOOT,
    PULLED,
    PULLING,
    WarmCondition,
    at_hello,
    at_pulls,
    at_warm,
    boot_due,
    boot_record,
    current,
    digests_on_node,
    label_patch,
    labels_from_images,
    labels_held,
    node_condition,
    node_label_of,
    present_at_boot,
    pulls_present,
)
from prewarm.domain.kubernetes import JobValidationError
from prewarm.domain.messages import Hello, RequiredImage
from prewarm.domain.nodes import NodeBoot, NodeWarm, RegisteredNode
from prewarm.domain.rules import PrewarmRule

REGISTRY = "123456789012.dkr.ecr.us-west-2.amazonaws.com"
DIGEST = "sha256:" + "a" * 64
TORCH = f"{REGISTRY}/ml/torch@{DIGEST}"


def required(*images: str) -> list[RequiredImage]:
    return [RequiredImage(image=image, job=f"default/{i}") for i, image in enumerate(images)]


def registered(boot: NodeBoot | None = None, warm_until: float | None = None) -> RegisteredNode:
    return RegisteredNode(name="n1", labels={}, architecture="amd64", os="linux", queue_url="q", last_hello=1.0,
                          warm_until=warm_until, boot=boot)


def test_an_image_is_present_at_boot_only_by_its_own_repository_and_digest() -> None:
    wanted = required(TORCH, f"{REGISTRY}/ml/tokenizer:v1", f"{REGISTRY}/ml/other@{DIGEST}", "not a reference!")
    # the same digest under another repository, and a tag, never count: a tag names no content
    digests = [TORCH, f"{REGISTRY}/ml/tokenizer@sha256:" + "b" * 64, f"docker.io/library/other@{DIGEST}"]

    assert present_at_boot(wanted, digests) == (TORCH,)
    assert present_at_boot(wanted, []) == ()
    # Docker Hub references as ImageStatus's repo digests name them
    assert present_at_boot(required(f"busybox@{DIGEST}"), [f"docker.io/library/busybox@{DIGEST}"]) == (
        f"busybox@{DIGEST}",)


def test_the_boot_record_lists_each_required_image_once_and_says_whether_all_were_there() -> None:
    boot = boot_record(required(TORCH, TORCH), [TORCH], at=5.0)
    assert boot == NodeBoot(required=(TORCH,), present=(TORCH,), at=5.0) and boot.all_present
    assert not NodeBoot(required=(), present=(), at=1.0).all_present
    assert not NodeBoot(required=(TORCH, "b@" + DIGEST), present=(TORCH,), at=1.0).all_present


def test_a_hello_is_a_first_one_without_a_record_or_for_another_join_under_the_name() -> None:
    boot = NodeBoot(required=(TORCH,), present=(), at=1.0)
    assert boot_due(None, Hello(node="n1"))
    assert boot_due(registered(), Hello(node="n1"))
    # the same join (a restarted agent: same deadline), or a hello without the taint, keeps the record
    assert not boot_due(registered(boot, warm_until=900.0), Hello(node="n1", warm_until=900.0))
    assert not boot_due(registered(boot, warm_until=900.0), Hello(node="n1"))
    # a new node under a reused name joined at another time
    assert boot_due(registered(boot, warm_until=900.0), Hello(node="n1", warm_until=2000.0))


def test_the_condition_at_hello_is_warm_pulling_or_nothing_required() -> None:
    assert at_hello(NodeBoot((TORCH,), (TORCH,), 1.0)) == WarmCondition(
        "True", PRESENT_AT_BOOT, "all 1 image required were present at boot (CRI), 0 bytes pulled")
    assert at_hello(NodeBoot((TORCH, "b@" + DIGEST), (), 1.0)) == WarmCondition(
        "False", PULLING, "0 of 2 images required were present at boot; pulling 2")
    assert at_hello(NodeBoot((), (), 1.0)).status == "True"
    assert at_hello(NodeBoot((), (), 1.0)).reason == NONE_REQUIRED


def test_the_condition_at_warm_says_pulled_with_bytes_present_at_boot_or_failed() -> None:
    warm = NodeWarm(joined_at=0, hello_at=1, warm_at=9, outcome="warm")
    partly = NodeBoot((TORCH, "b@" + DIGEST), (TORCH,), 1.0)
    assert at_warm(warm, partly) == WarmCondition(
        "True", PULLED, "all 2 images required present (1 present at boot)")
    assert at_warm(warm, None).message == "every required image present"
    assert at_warm(warm, NodeBoot((TORCH,), (TORCH,), 1.0)).reason == PRESENT_AT_BOOT
    timeout = NodeWarm(joined_at=0, hello_at=1, warm_at=900, outcome="timeout", missing=(TORCH,), missing_total=3)
    failed = at_warm(timeout, partly)
    assert (failed.status, failed.reason) == ("False", FAILED)
    assert failed.message == f"startup taint removed at maxWarmSeconds with 3 images missing: {TORCH} and 2 more"


def test_the_current_condition_is_the_warm_ups_then_the_hellos() -> None:
    boot = NodeBoot((TORCH,), (), 1.0)
    node = registered(boot)
    assert current(registered()) is None
    assert current(node) == at_hello(boot)
    node.warm = NodeWarm(joined_at=0, hello_at=1, warm_at=9, outcome="warm")
    assert current(node) == at_warm(node.warm, boot)


def test_the_patch_sets_that_condition_alone_and_is_read_back() -> None:
    condition = WarmCondition("True", PRESENT_AT_BOOT, "x" * 2000)
    patch = condition.patch(now=1_800_000_000)
    (written,) = patch["status"]["conditions"]
    assert written["type"] == CONDITION_TYPE and len(written["message"]) == 1024
    assert written["lastTransitionTime"] == "2027-01-15T08:00:00Z"
    node = {"status": {"conditions": [{"type": "Ready", "status": "True"}, written]}}
    assert node_condition(node) == WarmCondition("True", PRESENT_AT_BOOT, "x" * 1024)
    assert node_condition({"status": {"conditions": [{"type": "Ready"}]}}) is None
    assert node_condition({}) is None


# --- after the first hello: the condition from the node's pulls, and a rule's node label ------------------

NEWER = f"{REGISTRY}/ml/torch@sha256:{'c' * 64}"
LABEL = "prewarm.dev/torch"


def test_the_condition_from_pulls_counts_images_present_at_boot_and_names_the_missing() -> None:
    boot = NodeBoot(required=(TORCH,), present=(TORCH,), at=1.0)
    assert at_pulls(boot, [], []) == WarmCondition("True", NONE_REQUIRED, "no running Never job selects this node")
    assert at_pulls(boot, [TORCH], []).reason == PRESENT_AT_BOOT
    assert at_pulls(boot, [TORCH, NEWER], []) == WarmCondition(
        "True", PULLED, "all 2 images required present (1 present at boot)")
    assert at_pulls(None, [TORCH], []).message == "all 1 image required present (0 present at boot)"
    assert at_pulls(boot, [TORCH, NEWER], [NEWER]) == WarmCondition(
        "False", PULLING, f"1 of 2 images required present; pulling {NEWER}")
    many = [f"{REGISTRY}/ml/m{i}:v1" for i in range(5)]
    assert at_pulls(None, many, many).message.endswith(f"pulling {', '.join(sorted(many)[:3])} and 2 more")


def test_a_label_is_held_only_while_every_image_of_its_jobs_is_present() -> None:
    assert labels_held([(LABEL, True), ("a.io/b", True), (LABEL, False), (LABEL, True)]) == {
        LABEL: False, "a.io/b": True}
    assert labels_held([]) == {}


def test_the_label_patch_adds_or_removes_one_label_and_nothing_when_the_node_is_already_so() -> None:
    node = {"metadata": {"name": "n", "labels": {"pool": "gpu"}}}
    assert label_patch(node, LABEL, True) == [
        {"op": "add", "path": "/metadata/labels/prewarm.dev~1torch", "value": NODE_LABEL_VALUE}]
    assert label_patch(node, LABEL, False) is None
    assert label_patch({"metadata": {}}, "a~b", True) == [
        {"op": "add", "path": "/metadata/labels", "value": {"a~b": "true"}}]
    held = {"metadata": {"labels": {LABEL: "true"}}}
    assert label_patch(held, LABEL, True) is None
    assert label_patch(held, LABEL, False) == [
        {"op": "test", "path": "/metadata/labels/prewarm.dev~1torch", "value": "true"},
        {"op": "remove", "path": "/metadata/labels/prewarm.dev~1torch"}]
    # a label of that key someone set to another value is left alone when not held
    assert label_patch({"metadata": {"labels": {LABEL: "mine"}}}, LABEL, False) is None


def test_a_rules_node_label_is_carried_by_its_jobs_and_must_be_a_label_key() -> None:
    doc = {"apiVersion": "prewarm.dev/v1alpha1", "kind": "PrewarmRule", "metadata": {"name": "torch"},
           "spec": {"repositories": ["ml/*"], "nodeLabel": LABEL}}
    job = PrewarmRule.from_manifest(doc).job_for_push(REGISTRY, "ml/torch", DIGEST)
    assert node_label_of(job.to_manifest()) == LABEL
    assert node_label_of(PrewarmRule.from_manifest({**doc, "spec": {"repositories": ["ml/*"]}}).job_for_push(
        REGISTRY, "ml/torch", DIGEST).to_manifest()) is None
    for bad, why in (("Prewarm Torch", 'key "Prewarm Torch": name part must consist of alphanumeric'),
                     ("/torch", 'key "/torch": prefix part must not be empty')):
        with pytest.raises(JobValidationError) as caught:
            PrewarmRule.from_manifest({**doc, "spec": {"repositories": ["ml/*"], "nodeLabel": bad}})
        assert caught.value.errors[0].path == "spec.nodeLabel"
        assert caught.value.errors[0].message.startswith(why)


def test_a_late_node_s_label_holds_once_every_image_of_the_rule_s_newest_jobs_is_on_it() -> None:
    current = {"prewarm.dev/torch": {"r/a@sha256:1", "r/b@sha256:2"}, "prewarm.dev/other": {"r/c@sha256:3"}}
    # Judged only for a label whose images the node's Never jobs or boot say something of
    assert labels_from_images(current, present=["r/a@sha256:1"], known=["r/a@sha256:1"]) == {
        "prewarm.dev/torch": False}
    assert labels_from_images(current, present=["r/a@sha256:1", "r/b@sha256:2"],
                              known=["r/a@sha256:1", "r/b@sha256:2"]) == {"prewarm.dev/torch": True}
    assert labels_from_images(current, present=[], known=["r/c@sha256:3"]) == {"prewarm.dev/other": False}
    assert labels_from_images({"prewarm.dev/none": set()}, present=[], known=[]) == {}


def test_the_digests_the_kubelet_lists_on_a_node_are_held_there_as_pull_references() -> None:
    node = {"status": {"images": [
        {"names": ["busybox@sha256:" + "b" * 64, "busybox:1.36"], "sizeBytes": 10},
        {"names": ["r.io/a:v1"], "sizeBytes": 5},  # a tag names no content
        {"names": ["Not A Reference@@"]}, "not a mapping"]}}
    assert digests_on_node(node) == {"docker.io/library/busybox@sha256:" + "b" * 64}
    assert digests_on_node({"status": {}}) == frozenset() == digests_on_node({})


def test_an_image_the_node_holds_is_present_whatever_its_new_round_says() -> None:
    a, b = "r/a@sha256:" + "1" * 64, "r/b@sha256:" + "2" * 64
    assert pulls_present([(a, False), (b, False)], held=[a]) == {a: True, b: False}
    assert pulls_present([(b, True)], held=[]) == {b: True}
    # The same image in two jobs: present only if each says so or the node holds it
    assert pulls_present([(b, True), (b, False)], held=[]) == {b: False}
    assert pulls_present([(b, True), (b, False)], held=[b]) == {b: True}
