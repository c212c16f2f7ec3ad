"""Warm as a node fact: which of a node's required images were on it when it booted, and the `PrewarmWarm`
condition that says where its warm-up stands (docs/agent.md, "Warm at boot").

A node's first hello lists the repo digests its containerd holds (CRI `ListImages`, before the agent
pulls anything). Against the images the control plane wants on the node at join (`required_images`),
that says which were present at boot: a node booted from a warm snapshot, or pre-pulled before its
agent started, has all of them and is released at once. Everything here is pure.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from prewarm.domain.images import InvalidImageReference, parse_image
from prewarm.domain.jobs import NODE_LABEL_ANNOTATION
from prewarm.domain.kubernetes import format_time
from prewarm.domain.messages import Hello, RequiredImage
from prewarm.domain.nodes import NodeBoot, NodeWarm, RegisteredNode

CONDITION_TYPE = "PrewarmWarm"
# The condition's reasons: CamelCase, as Kubernetes condition reasons are.
PRESENT_AT_BOOT = "ImagesPresentAtBoot"
PULLED = "ImagesPulled"
PULLING = "Pulling"
FAILED = "Failed"
NONE_REQUIRED = "NoImagesRequired"
# A condition's message is free text; the API keeps it whole, `kubectl describe` shows it on one line.
MESSAGE_MAX = 1024
# The value of a rule's `spec.nodeLabel` on a node that has every image of the rule's jobs on it.
NODE_LABEL_VALUE = "true"


def present_at_boot(required: Iterable[RequiredImage], digests: Iterable[str]) -> tuple[str, ...]:
    """The required images (their pull references, sorted, each once) that `digests` (the hello's repo
    digests, `name@sha256:...`) hold. Only a reference pinned by digest can be matched: a tag names no
    content, so an image required by tag is never taken as present at boot (its agent checks it with
    CRI `ImageStatus`, as for any image)."""
    held = set(digests)
    found = set()
    for entry in required:
        try:
            ref = parse_image(entry.image)
        except InvalidImageReference:
            continue
        if ref.digest is not None and f"{ref.name}@{ref.digest}" in held:
            found.add(entry.image)
    return tuple(sorted(found))


def boot_due(prior: RegisteredNode | None, hello: Hello) -> bool:
    """Whether `hello` is the node's first, as far as its images at boot go: no registration yet, none
    recorded, or a hello that holds the startup taint until another deadline than the registration's (a
    new node under a reused name: its deadline counts from another join). A restarted agent on the same
    node keeps the record its first hello made."""
    if prior is None or prior.boot is None:
        return True
    return hello.warm_until is not None and prior.warm_until != hello.warm_until


def boot_record(required: Sequence[RequiredImage], digests: Iterable[str], *, at: float) -> NodeBoot:
    """What a node's first hello tells: how many images it was required to have, which it had."""
    wanted = sorted({r.image for r in required})
    return NodeBoot(required=tuple(wanted), present=present_at_boot(required, digests), at=at)


@dataclass(frozen=True)
class WarmCondition:
    """The node's `PrewarmWarm` condition: `True` once every required image is present."""

    status: str  # "True" or "False"
    reason: str
    message: str

    def patch(self, *, now: float) -> dict[str, Any]:
        """A strategic merge patch of the Node's status (conditions merge by `type`): this condition alone."""
        stamp = format_time(now)
        return {"status": {"conditions": [{
            "type": CONDITION_TYPE, "status": self.status, "reason": self.reason,
            "message": self.message[:MESSAGE_MAX], "lastHeartbeatTime": stamp, "lastTransitionTime": stamp,
        }]}}


def node_condition(node: Mapping[str, Any]) -> WarmCondition | None:
    """The `PrewarmWarm` condition a Node object carries, if any."""
    for condition in (node.get("status") or {}).get("conditions") or ():
        if isinstance(condition, Mapping) and condition.get("type") == CONDITION_TYPE:
            return WarmCondition(str(condition.get("status", "")), str(condition.get("reason", "")),
                                 str(condition.get("message", "")))
    return None


def _images(count: int) -> str:
    return f"{count} image" if count == 1 else f"{count} images"


def at_hello(boot: NodeBoot) -> WarmCondition:
    """The condition a node's first hello sets: warm when every required image was present at boot."""
    total, present = len(boot.required), len(boot.present)
    if not total:
        return WarmCondition("True", NONE_REQUIRED, "no running Never job selects this node")
    if boot.all_present:
        return WarmCondition("True", PRESENT_AT_BOOT,
                             f"all {_images(total)} required were present at boot (CRI), 0 bytes pulled")
    return WarmCondition("False", PULLING, f"{present} of {_images(total)} required were present at boot; "
                                           f"pulling {total - present}")


def current(node: RegisteredNode) -> WarmCondition | None:
    """The condition record_status last set from what the node's registration holds (None: nothing yet)."""
    if node.warm is not None:
        return at_warm(node.warm, node.boot)
    return at_hello(node.boot) if node.boot is not None else None


def at_warm(warm: NodeWarm, boot: NodeBoot | None) -> WarmCondition:
    """The condition once the startup taint came off (the agent's `Warmed`)."""
    if warm.outcome != "warm":
        names = ", ".join(warm.missing) or "unknown images"
        more = f" and {warm.missing_total - len(warm.missing)} more" if warm.missing_total > len(warm.missing) else ""
        return WarmCondition("False", FAILED, f"startup taint removed at maxWarmSeconds with "
                                              f"{_images(max(warm.missing_total, 1))} missing: {names}{more}")
    if boot is not None and boot.all_present:
        return at_hello(boot)
    count = f"all {_images(len(boot.required))} required" if boot is not None else "every required image"
    present = f" ({len(boot.present)} present at boot)" if boot is not None else ""
    return WarmCondition("True", PULLED, f"{count} present{present}")


def at_pulls(boot: NodeBoot | None, required: Sequence[str], missing: Sequence[str]) -> WarmCondition:
    """The condition from the node's tasks in the running `Never` jobs that select it (`required`: their pull
    references; `missing`: those neither Succeeded there nor present at boot): what keeps a node's condition
    true to its images after its first hello, tainted or not."""
    wanted = sorted(set(required))
    if not wanted:
        return WarmCondition("True", NONE_REQUIRED, "no running Never job selects this node")
    absent = sorted(set(missing))
    if not absent:
        at_boot = len(set(wanted) & set(boot.present)) if boot is not None else 0
        if at_boot == len(wanted):
            return WarmCondition("True", PRESENT_AT_BOOT,
                                 f"all {_images(len(wanted))} required were present at boot (CRI), 0 bytes pulled")
        return WarmCondition("True", PULLED, f"all {_images(len(wanted))} required present ({at_boot} present at boot)")
    names = ", ".join(absent[:3]) + (f" and {len(absent) - 3} more" if len(absent) > 3 else "")
    return WarmCondition("False", PULLING, f"{len(wanted) - len(absent)} of {_images(len(wanted))} required present; "
                                           f"pulling {names}")


def node_label_of(manifest: Mapping[str, Any]) -> str | None:
    """The node label a rule's job carries (`NODE_LABEL_ANNOTATION`), or None."""
    annotations = (manifest.get("metadata") or {}).get("annotations") or {}
    key = annotations.get(NODE_LABEL_ANNOTATION) if isinstance(annotations, Mapping) else None
    return key if isinstance(key, str) and key else None


def labels_held(pulls: Iterable[tuple[str, bool]]) -> dict[str, bool]:
    """Per node label, from (label, the image of one of its jobs present on the node) of the node's tasks in
    those jobs: whether every one is present. One image not yet there (a new digest pushed) takes it off."""
    held: dict[str, bool] = {}
    for key, present in pulls:
        held[key] = held.get(key, True) and present
    return held


def digests_on_node(node: Mapping[str, Any]) -> frozenset[str]:
    """The images the kubelet lists on the Node by digest, as pull references: `status.images[].names` holds
    each image's repo digests (`name@sha256:...`) beside its tags, the largest images first (50 by default,
    the kubelet's `nodeStatusMaxImages`)."""
    held = set()
    for image in (node.get("status") or {}).get("images") or ():
        for name in (image.get("names") or ()) if isinstance(image, Mapping) else ():
            try:
                ref = parse_image(str(name))
            except InvalidImageReference:
                continue
            if ref.digest is not None:
                held.add(ref.pull_reference)
    return frozenset(held)


def pulls_present(pulls: Iterable[tuple[str, bool]], held: Collection[str]) -> dict[str, bool]:
    """Per image of the node's tasks (its pull reference, whether its task Succeeded in the job's round): whether
    it is on the node. An image the node holds (`held`: present at boot, or listed on its Node) is, whatever
    its task says: a new round re-pulling a digest the node has (a `Never` job's daily round, a pull policy
    `Always`) does not take it off while it runs.

    >>> pulls_present([("r/a@sha256:1", False), ("r/b@sha256:2", False)], held=["r/a@sha256:1"])
    {'r/a@sha256:1': True, 'r/b@sha256:2': False}
    """
    present: dict[str, bool] = {}
    for image, succeeded in pulls:
        present[image] = present.get(image, True) and (succeeded or image in held)
    return present


def labels_from_images(current: Mapping[str, Collection[str]], present: Collection[str],
                       known: Collection[str]) -> dict[str, bool]:
    """For a node in none of a labelled rule's jobs (it joined after the rule's last push): per label, whether
    every image of the rule's newest jobs (`current`: label -> their pull references) is on the node
    (`present`: Succeeded in its `Never` jobs, or there at boot). A label none of whose images the node's
    `Never` jobs or boot say anything of (`known`) is not judged: nothing tells whether they are there.

    >>> labels_from_images({"warm": ["r/a@sha256:1"], "gpu": ["r/b@sha256:2"]}, [], ["r/a@sha256:1"])
    {'warm': False}
    """
    return {label: all(image in present for image in images) for label, images in current.items()
            if images and not set(images).isdisjoint(known)}


def _pointer(key: str) -> str:
    """`key` as a JSON pointer's segment (RFC 6901: `~` is `~0`, `/` is `~1`)."""
    return key.replace("~", "~0").replace("/", "~1")


def label_patch(node: Mapping[str, Any], key: str, held: bool) -> list[dict[str, Any]] | None:
    """A JSON patch of `node` that sets label `key` to `NODE_LABEL_VALUE` (`held`) or removes it (a removal
    guarded by a `test` of its value: a label of that key someone else set is left), or None when the node
    is already so."""
    labels = (node.get("metadata") or {}).get("labels")
    value = labels.get(key) if isinstance(labels, Mapping) else None
    if held:
        if value == NODE_LABEL_VALUE:
            return None
        if not isinstance(labels, Mapping):
            return [{"op": "add", "path": "/metadata/labels", "value": {key: NODE_LABEL_VALUE}}]
        return [{"op": "add", "path": f"/metadata/labels/{_pointer(key)}", "value": NODE_LABEL_VALUE}]
    if value != NODE_LABEL_VALUE:
        return None
    path = f"/metadata/labels/{_pointer(key)}"
    return [{"op": "test", "path": path, "value": NODE_LABEL_VALUE}, {"op": "remove", "path": path}]
