"""Where a job or rule comes from, and how a Kubernetes resource becomes the manifest the table stores.

Three sources meet in one table. A resource (`prewarm.dev/v1alpha1` ImagePullJob, ImageListPullJob,
PrewarmRule or AdvancedCronJob in the cluster) owns its name: `sync_resources` applies it, deletes the job when the
resource goes, and writes status back; the CLI may read such a job but not apply or delete it. A job
applied with the CLI (`cli`) is the CLI's: a resource of the same name is refused and told why. A rule
makes jobs on image pushes (`rule`). The stored manifest says which, in `SOURCE_ANNOTATION`, so no
table item grows a field for it.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from enum import StrEnum
from typing import Any

from prewarm.domain.cronjobs import CRON_JOB_ANNOTATION
from prewarm.domain.jobs import PREWARM_API_VERSION
from prewarm.domain.rules import RULE_ANNOTATION

__all__ = [
    "GENERATION_ANNOTATION",
    "RESOURCE_KINDS",
    "RESOURCE_UID_ANNOTATION",
    "SOURCE_ANNOTATION",
    "STACK_KINDS",
    "Source",
    "SourceConflictError",
    "reserved_annotation_problems",
    "resource_generation",
    "resource_manifest",
    "resource_uid",
    "source_of",
]

SOURCE_ANNOTATION = "prewarm.dev/source"
# The resource's metadata.generation the stored job was applied from: spec changes bump it, status
# writes do not, so an unchanged resource costs no table write.
GENERATION_ANNOTATION = "prewarm.dev/resource-generation"
# An AdvancedCronJob resource's `metadata.uid`: deleted and created again under its name (within a sync, at its
# same generation), it is another cron job, whose runs are not those its namesake left running.
RESOURCE_UID_ANNOTATION = "prewarm.dev/resource-uid"
#: Resource kind → plural, in apply order (a list job's children are ImagePullJobs of its own).
RESOURCE_KINDS = {"PrewarmRule": "prewarmrules", "WarmSnapshot": "warmsnapshots",
                  "ImageListPullJob": "imagelistpulljobs", "ImagePullJob": "imagepulljobs",
                  "AdvancedCronJob": "advancedcronjobs"}
#: The kinds that belong to the stack, not to a cluster: cluster-scoped, read from the stack's own cluster.
STACK_KINDS = ("PrewarmRule", "WarmSnapshot")
RESOURCE_API_VERSION = PREWARM_API_VERSION


class Source(StrEnum):
    CLI = "cli"
    RESOURCE = "resource"
    RULE = "rule"
    CRON = "cron"


class SourceConflictError(ValueError):
    """A name one source owns was applied or deleted through another; the message says how to change it."""


def source_of(manifest: Mapping[str, Any]) -> Source:
    annotations = (manifest.get("metadata") or {}).get("annotations") or {}
    if annotations.get(SOURCE_ANNOTATION) == Source.RESOURCE:
        return Source.RESOURCE
    if RULE_ANNOTATION in annotations:
        return Source.RULE
    if CRON_JOB_ANNOTATION in annotations:
        return Source.CRON
    return Source.CLI


def resource_generation(manifest: Mapping[str, Any]) -> str:
    return str(((manifest.get("metadata") or {}).get("annotations") or {}).get(GENERATION_ANNOTATION, ""))


def resource_uid(manifest: Mapping[str, Any]) -> str:
    """The uid of the cron job resource a stored manifest was applied from ("" for any other)."""
    return str(((manifest.get("metadata") or {}).get("annotations") or {}).get(RESOURCE_UID_ANNOTATION, ""))


def resource_manifest(obj: Mapping[str, Any]) -> dict[str, Any]:
    """The manifest to apply for a resource as the API returns it: its spec, name, namespace, labels and
    annotations, marked as the resource's; server fields and status left out."""
    meta = obj.get("metadata") or {}
    annotations = {k: v for k, v in (meta.get("annotations") or {}).items()
                   if k != "kubectl.kubernetes.io/last-applied-configuration"}
    annotations.update({SOURCE_ANNOTATION: Source.RESOURCE, GENERATION_ANNOTATION: str(meta.get("generation", ""))})
    if obj.get("kind") == "AdvancedCronJob" and meta.get("uid"):
        annotations[RESOURCE_UID_ANNOTATION] = str(meta["uid"])
    metadata: dict[str, Any] = {"name": meta.get("name", ""), "annotations": annotations}
    if meta.get("namespace"):
        metadata["namespace"] = meta["namespace"]
    if meta.get("labels"):
        metadata["labels"] = dict(meta["labels"])
    return {"apiVersion": obj.get("apiVersion"), "kind": obj.get("kind"), "metadata": metadata,
            "spec": copy.deepcopy(obj.get("spec") or {})}


def reserved_annotation_problems(doc: Mapping[str, Any]) -> list[tuple[str, str]]:
    """A manifest applied with the CLI may not claim to be a resource's."""
    metadata = doc.get("metadata")
    annotations = (metadata.get("annotations") if isinstance(metadata, Mapping) else None) or {}
    if not isinstance(annotations, Mapping):
        return []
    return [(f"metadata.annotations.{key}", "is set by the resource sync only: remove it")
            for key in (SOURCE_ANNOTATION, GENERATION_ANNOTATION, RESOURCE_UID_ANNOTATION) if key in annotations]
