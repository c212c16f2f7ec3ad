"""When images Prewarm put on nodes stop being wanted: the rules, pure.

A pinned job (annotation `prewarm.dev/pin: "true"`, `ImagePullJob.pin`) has its image pinned in
containerd on every node whose pull succeeded. When the job is deleted, or its TTL ends it, each such
node is sent a `ReleaseImage`, unless another live pinned job wants the same image on that node: the
same pull reference, or the same image (`image_id`, the config digest the CRI reports) under another
name. A pin is a label on every record of one image in containerd, so unpinning one name unpins them all;
that is why the image, not the name, decides.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from prewarm.domain.job import StoredJob
from prewarm.domain.jobs import JobState
from prewarm.domain.messages import NodePhase, ReleaseImage
from prewarm.domain.status import NodeTaskRecord


@dataclass(frozen=True)
class NodeImage:
    """One image a job has, or is getting, on one node: the reference its tasks pull, and the image's id
    once a pull reported it."""

    node: str
    reference: str
    image_id: str | None = None


def holds_pin(job: StoredJob) -> bool:
    """Whether `job` keeps its image pinned on its nodes: a live (not deleting) pinned ImagePullJob."""
    return job.is_pull_job and job.state is not JobState.DELETING and job.pull_job.pin


def images_on_nodes(job: StoredJob, tasks: Iterable[NodeTaskRecord]) -> list[NodeImage]:
    """The nodes where `job`'s image is, or may soon be: every node item but the failed and cancelled ones
    (a pull in flight may still succeed and pin)."""
    reference = job.pull_reference
    return [NodeImage(t.node, reference, t.image_id) for t in tasks if not t.failed]


def releases(ended: StoredJob, tasks: Iterable[NodeTaskRecord],
             still_pinned: Mapping[str, Sequence[NodeImage]]) -> list[ReleaseImage]:
    """What the nodes of `ended` (a pinned job being deleted or expiring) are sent: a `ReleaseImage` for
    each node where its pull succeeded, unless an image in `still_pinned[node]` (other live pinned jobs'
    images on that node, `images_on_nodes`) is the same image.

    >>> from prewarm.domain.job import ApiKind
    >>> manifest = {"metadata": {"name": "a", "namespace": "ns", "annotations": {"prewarm.dev/pin": "true"}},
    ...             "spec": {"image": "reg.io/app:v1"}, "apiVersion": "apps.kruise.io/v1alpha1",
    ...             "kind": "ImagePullJob"}
    >>> job = StoredJob("ns", "a", "uid", ApiKind.IMAGE_PULL_JOB, manifest, "h", state=JobState.DELETING)
    >>> done = [NodeTaskRecord("n1", 0, NodePhase.SUCCEEDED), NodeTaskRecord("n2", 0, NodePhase.SUCCEEDED)]
    >>> [r.node for r in releases(job, done, {"n2": [NodeImage("n2", "reg.io/app:v1")]})]
    ['n1']
    """
    if not ended.is_pull_job or not ended.pull_job.pin:
        return []
    reference = ended.pull_reference
    out = []
    for task in tasks:
        if task.phase is not NodePhase.SUCCEEDED:
            continue
        mine = NodeImage(task.node, reference, task.image_id)
        if any(_same_image(mine, other) for other in still_pinned.get(task.node, ())):
            continue
        out.append(ReleaseImage(node=task.node, job=ended.key, image=reference, cluster=ended.cluster))
    return out


def _same_image(a: NodeImage, b: NodeImage) -> bool:
    return a.reference == b.reference or (a.image_id is not None and a.image_id == b.image_id)
