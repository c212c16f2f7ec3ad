"""`prewarm apply --as-resource`: manifests written as prewarm.dev/v1alpha1 resources into the cluster.

The manifest is validated exactly as a table apply validates it, then created, or replaced when its
spec (compared as the table compares it, defaults filled in), labels or annotations differ (an
unchanged resource is not written, as `kubectl apply` leaves it). A Kruise manifest
(`apps.kruise.io/...`) becomes the same kind of `prewarm.dev/v1alpha1`: the spec is Kruise's, accepted
verbatim.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from prewarm.domain.jobs import PREWARM_API_VERSION
from prewarm.domain.kubernetes import JobValidationError, manifest_subject
from prewarm.domain.manifests import parse_manifest
from prewarm.domain.sources import RESOURCE_KINDS, STACK_KINDS, reserved_annotation_problems

Obj = dict[str, Any]


class ResourceWriter:
    """Creates or updates resources; the cluster is reached on the first write."""

    def __init__(self, connect: Callable[[], Any]) -> None:
        self._connect = connect
        self._cluster: Any = None

    def apply(self, doc: Obj) -> str:
        """The kubectl-style line: `imagepulljob.prewarm.dev/web created|configured|unchanged`."""
        if problems := reserved_annotation_problems(doc):
            raise JobValidationError(problems, manifest_subject(doc))
        parsed = parse_manifest(doc)  # the table's validation, so both paths refuse the same manifests
        body = resource_body(doc, parsed.metadata.model_dump(by_alias=True, exclude_none=True))
        kind, name = body["kind"], body["metadata"]["name"]
        namespace = body["metadata"].get("namespace")
        plural = RESOURCE_KINDS[kind]
        if self._cluster is None:
            self._cluster = self._connect()
        current = self._cluster.get_object(PREWARM_API_VERSION, plural, name, namespace)
        if current is None:
            self._cluster.create_object(PREWARM_API_VERSION, plural, body, namespace)
            outcome = "created"
        elif _same(current, body, parsed.spec_hash()):
            outcome = "unchanged"
        else:
            body["metadata"]["resourceVersion"] = current["metadata"]["resourceVersion"]
            self._cluster.replace_object(PREWARM_API_VERSION, plural, name, body, namespace)
            outcome = "configured"
        return f"{kind.lower()}.prewarm.dev/{name} {outcome}"


def resource_body(doc: Obj, metadata: Obj) -> Obj:
    """The resource for a manifest: its kind at prewarm.dev/v1alpha1, its metadata and its spec as written."""
    meta: Obj = {"name": metadata["name"]}
    if doc.get("kind") not in STACK_KINDS:
        meta["namespace"] = metadata.get("namespace") or "default"
    for key in ("labels", "annotations"):
        if metadata.get(key):
            meta[key] = dict(metadata[key])
    return {"apiVersion": PREWARM_API_VERSION, "kind": doc["kind"], "metadata": meta, "spec": doc.get("spec") or {}}


def _same_spec(current: Obj, spec_hash: str) -> bool:
    """Whether the stored resource's spec means the manifest's: the CRD stores Kruise's defaults, so a
    manifest that leaves them out is the same job."""
    try:
        return parse_manifest({**current, "status": None}).spec_hash() == spec_hash
    except JobValidationError:
        return False


def _same(current: Obj, body: Obj, spec_hash: str) -> bool:
    meta, wanted = current.get("metadata") or {}, body["metadata"]
    return bool((current.get("spec") == body["spec"] or _same_spec(current, spec_hash))
                and (meta.get("labels") or {}) == wanted.get("labels", {})
                and all((meta.get("annotations") or {}).get(k) == v for k, v in wanted.get("annotations", {}).items()))
