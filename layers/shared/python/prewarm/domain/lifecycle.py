"""When images Prewarm put on nodes stop being wanted: the rules, pure.

- **Release.** When a job is deleted, or its TTL ends it, or a new spec changes its image (at the plan of
  its new round, for the nodes of the earlier round), each node where its pull succeeded is sent a
  `ReleaseImage` that unpins the image (a pinned job's: annotation `prewarm.dev/pin: "true"`) unless another
  live pinned job wants the same image on that node, and removes it after the stack's grace period unless
  another live job (pinned or not) wants it there. "The same image" is the same pull reference, or the same
  image id (the config digest the CRI reports) under another name: a pin labels every name of an image,
  and CRI `RemoveImage` removes every name, so the image decides, not the name.
- **Removal on the node** (`removal_refusal`): only an image the agent pulled itself, every name of which
  it pulled, none of which Prewarm still wants, and that no container on the node uses.
- **A pin removed** (`pin_dropped`): a job whose new spec no longer pins its image unpins it on its nodes
  (unless another live pinned job wants it there) and keeps it: the job still wants it. A pull the pinned
  spec sent that ends later pins the image as it ends: its node is told to unpin on its `Succeeded`, and
  again at the job's end (`StoredJob.pinned_until`).
- **Superseded digests** (`superseded`): a rule's `keepDigests` earlier digests of a tag stay; the jobs of
  older ones are deleted at the next push, which releases their images as above.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from enum import StrEnum

from prewarm.domain.images import parse_image
from prewarm.domain.job import StoredJob
from prewarm.domain.jobs import JobState
from prewarm.domain.messages import NodePhase, ReleaseImage
from prewarm.domain.rules import REPOSITORY_ANNOTATION, RULE_ANNOTATION, TAG_ANNOTATION
from prewarm.domain.status import NodeTaskRecord


@dataclass(frozen=True)
class NodeImage:
    """One image a job has, or is getting, on one node: the reference its tasks pull, and the image's id
    once a pull reported it."""

    node: str
    reference: str
    image_id: str | None = None
    pinned: bool = False


def wants_images(job: StoredJob) -> bool:
    """Whether `job` still wants its image on its nodes: a live (not deleting) ImagePullJob."""
    return job.is_pull_job and job.state is not JobState.DELETING


def wanted_repository(job: StoredJob) -> str | None:
    """The repository whose releases must ask `job` what it wants (the `images` index of the job table
    holds it), or None for a job that wants no image. A job's earlier image (a new round not planned yet)
    is not indexed: that round's plan releases it soon, and the agent keeps what a task wants again."""
    return parse_image(job.image).name if wants_images(job) and job.image else None


def images_on_nodes(job: StoredJob, tasks: Iterable[NodeTaskRecord]) -> list[NodeImage]:
    """The nodes where `job`'s image is, or may soon be: every node item but the failed and cancelled ones
    (a pull in flight may still succeed and pin)."""
    return [NodeImage(t.node, image.reference, t.image_id, image.pinned) for t in tasks if not t.failed
            for image in [job.image_of_round(t.round)]]


def releases(ended: StoredJob, tasks: Iterable[NodeTaskRecord], still_wanted: Mapping[str, Sequence[NodeImage]],
             *, remove_after: int | None = None) -> list[ReleaseImage]:
    """What the nodes of `ended` (a job being deleted or expiring) are sent: for each node where its pull
    succeeded, a `ReleaseImage` that unpins (when `ended` pinned and no image of `still_wanted[node]`, the
    other live jobs' images there, is the same image pinned) and removes after `remove_after` seconds
    (None: never; when no image of `still_wanted[node]` is the same image). Nothing to either: no message.

    >>> from prewarm.domain.job import ApiKind
    >>> manifest = {"metadata": {"name": "a", "namespace": "ns", "annotations": {"prewarm.dev/pin": "true"}},
    ...             "spec": {"image": "reg.io/app:v1"}, "apiVersion": "apps.kruise.io/v1alpha1",
    ...             "kind": "ImagePullJob"}
    >>> job = StoredJob("ns", "a", "uid", ApiKind.IMAGE_PULL_JOB, manifest, "h", state=JobState.DELETING)
    >>> done = [NodeTaskRecord("n1", 0, NodePhase.SUCCEEDED), NodeTaskRecord("n2", 0, NodePhase.SUCCEEDED)]
    >>> [r.node for r in releases(job, done, {"n2": [NodeImage("n2", "reg.io/app:v1", pinned=True)]})]
    ['n1']
    """
    if not ended.is_pull_job:
        return []
    out = []
    for task in tasks:
        if task.phase is not NodePhase.SUCCEEDED:
            continue
        pulled = ended.image_of_round(task.round)  # an earlier round's node items hold its own image
        mine = NodeImage(task.node, pulled.reference, task.image_id)
        same = [other for other in still_wanted.get(task.node, ()) if _same_image(mine, other)]
        unpin = ended.pinned_in(task.round) and not any(other.pinned for other in same)
        remove = remove_after is not None and not same
        if unpin or remove:
            out.append(ReleaseImage(node=task.node, job=ended.key, image=pulled.reference, cluster=ended.cluster,
                                    unpin=unpin, remove_after=remove_after if remove else None))
    return out


def earlier_round_releases(job: StoredJob, earlier: Iterable[NodeTaskRecord], selected: Iterable[str],
                           still_wanted: Mapping[str, Sequence[NodeImage]], *, remove_after: int | None
                           ) -> list[ReleaseImage]:
    """What the plan of a round whose image changed (`job.earlier`) sends the nodes of the `earlier` round's
    items it replaces: as `releases`, where the new round's `selected` nodes want the job's new image too
    (the same image under its new name is kept, and stays pinned if the job still pins)."""
    if job.earlier is None:
        return []
    mine = NodeImage("", job.pull_reference, None, job.pull_job.pin)
    wanted = {node: list(images) for node, images in still_wanted.items()}
    for node in selected:
        wanted.setdefault(node, []).append(replace(mine, node=node))
    return releases(job, [t for t in earlier if t.round <= job.earlier.round], wanted, remove_after=remove_after)


def pin_dropped(job: StoredJob, before: StoredJob | None) -> bool:
    """Whether a new spec of `job` stopped pinning the image `before` (the job as it was) pinned on its
    nodes: the same image, its pin annotation removed, a round that was planned. (A new image releases the
    earlier one, pin and all, at its round's plan: `earlier_round_releases`.)"""
    return (before is not None and before.is_pull_job and job.is_pull_job and before.round_is_planned
            and before.pull_job.pin and not job.pull_job.pin and before.pull_reference == job.pull_reference)


def _same_image(a: NodeImage, b: NodeImage) -> bool:
    return a.reference == b.reference or (a.image_id is not None and a.image_id == b.image_id)


class RefusalKind(StrEnum):
    """Why an image due for removal stays: a container uses it (tried again later), it has a name the agent
    did not pull (not Prewarm's alone: never removed), or Prewarm wants it again under a name (kept)."""

    IN_USE = "in use"
    NOT_PULLED = "not pulled"
    WANTED = "wanted"


@dataclass(frozen=True)
class RemovalRefusal:
    kind: RefusalKind
    reason: str


def removal_refusal(names: Collection[str], image_id: str, *, pulled: Collection[str], wanted: Collection[str],
                    in_use: Collection[str]) -> RemovalRefusal | None:
    """Why the agent must not remove the image `image_id` whose names in containerd are `names`, or None when
    it may: `pulled` holds every name the agent pulled this image by (its record), `wanted` every name
    Prewarm still wants on the node (pulled images not released), `in_use` the images of the node's
    containers as CRI `ListContainers` gives them (names or ids). CRI `RemoveImage` removes every name of an
    image (containerd 1.6 to 2.1), so each name must be one the agent pulled and none may be wanted.

    >>> removal_refusal(["r/a:v1", "r/a@sha256:1"], "sha256:c", pulled={"r/a:v1", "r/a@sha256:1"}, wanted=(),
    ...                 in_use={"sha256:c"}).reason
    'a container on the node uses it'
    >>> removal_refusal(["r/a:v1", "r/a:latest"], "sha256:c", pulled={"r/a:v1"}, wanted=(), in_use=()).reason
    'named r/a:latest, which Prewarm did not pull'
    """
    if image_id in in_use or any(name in in_use for name in names):
        return RemovalRefusal(RefusalKind.IN_USE, "a container on the node uses it")
    if foreign := sorted(set(names) - set(pulled)):
        return RemovalRefusal(RefusalKind.NOT_PULLED, f"named {', '.join(foreign)}, which Prewarm did not pull")
    if still := sorted(set(names) & set(wanted)):
        return RemovalRefusal(RefusalKind.WANTED, f"still wanted as {', '.join(still)}")
    return None


def superseded(newest: StoredJob, jobs: Iterable[StoredJob], keep: int) -> list[StoredJob]:
    """The jobs of `jobs` whose digests a push of `newest` (a rule's job) superseded beyond the `keep` most
    recent earlier ones: the same rule's live jobs of the same repository and tag in the same cluster, by
    creation. An untagged push supersedes nothing.

    >>> from prewarm.domain.job import ApiKind
    >>> def job(name, digest, at):
    ...     notes = {"prewarm.dev/rule": "r", "prewarm.dev/repository": "app", "prewarm.dev/tag": "v1"}
    ...     manifest = {"apiVersion": "apps.kruise.io/v1alpha1", "kind": "ImagePullJob",
    ...                 "metadata": {"name": name, "namespace": "ns", "annotations": notes},
    ...                 "spec": {"image": f"reg.io/app@sha256:{digest * 64}"}}
    ...     return StoredJob("ns", name, name, ApiKind.IMAGE_PULL_JOB, manifest, "h", created_at=at)
    >>> jobs = [job("r-a", "a", 1.0), job("r-b", "b", 2.0), job("r-c", "c", 3.0)]
    >>> [j.name for j in superseded(jobs[2], jobs, keep=1)]
    ['r-a']
    """
    origin = _rule_origin(newest)
    if origin is None:
        return []
    earlier = [job for job in jobs if job.key != newest.key and job.cluster == newest.cluster
               and job.state is not JobState.DELETING and _rule_origin(job) == origin
               and job.pull_reference != newest.pull_reference]
    earlier.sort(key=lambda job: (job.created_at or 0.0, job.name), reverse=True)
    return earlier[keep:]


def _rule_origin(job: StoredJob) -> tuple[str, str, str] | None:
    """The rule, repository and tag a rule's job was made for (the annotations `job_for_push` sets); None
    for any other job, and for an untagged push's."""
    notes = (job.manifest.get("metadata") or {}).get("annotations") or {}
    rule, repository, tag = (notes.get(k) for k in (RULE_ANNOTATION, REPOSITORY_ANNOTATION, TAG_ANNOTATION))
    if not (isinstance(rule, str) and isinstance(repository, str) and isinstance(tag, str)) or not (rule and tag):
        return None
    return rule, repository, tag
