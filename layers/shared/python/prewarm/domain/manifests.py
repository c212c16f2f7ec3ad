"""Reading manifests: one YAML document or many, each validated as the model its `kind` names."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from prewarm.domain.cronjobs import CRON_API_VERSIONS, V1ALPHA1_REFUSED, AdvancedCronJob
from prewarm.domain.jobs import JOB_API_VERSIONS, PREWARM_API_VERSION, ImageListPullJob, ImagePullJob
from prewarm.domain.kubernetes import JobValidationError, describe_value, manifest_subject, quoted_choices
from prewarm.domain.rules import PrewarmRule
from prewarm.domain.snapshots import WarmSnapshot

Manifest = ImagePullJob | ImageListPullJob | PrewarmRule | WarmSnapshot | AdvancedCronJob

_KINDS: dict[str, tuple[type[Manifest], tuple[str, ...]]] = {
    "ImagePullJob": (ImagePullJob, JOB_API_VERSIONS),
    "ImageListPullJob": (ImageListPullJob, JOB_API_VERSIONS),
    "PrewarmRule": (PrewarmRule, (PREWARM_API_VERSION,)),
    "WarmSnapshot": (WarmSnapshot, (PREWARM_API_VERSION,)),
    "AdvancedCronJob": (AdvancedCronJob, CRON_API_VERSIONS),
}


def parse_manifest(doc: Any) -> Manifest:
    """Validate one manifest dict, choosing the model by `apiVersion` and `kind`."""
    if not isinstance(doc, Mapping):
        message = f"a manifest must be a mapping with apiVersion and kind (got {describe_value(doc)})"
        raise JobValidationError([("", message)])
    subject = manifest_subject(doc)
    kind, api_version = doc.get("kind"), doc.get("apiVersion")
    if kind is None:
        raise JobValidationError([("kind", "required")], subject)
    if not isinstance(kind, str) or kind not in _KINDS:
        message = f'unsupported kind "{kind}": supported kinds are {", ".join(_KINDS)}'
        raise JobValidationError([("kind", message)], subject)
    model, versions = _KINDS[kind]
    if api_version is None:
        raise JobValidationError([("apiVersion", "required")], subject)
    if kind == "AdvancedCronJob" and api_version == "apps.kruise.io/v1alpha1":
        raise JobValidationError([("apiVersion", V1ALPHA1_REFUSED)], subject)
    if api_version not in versions:
        message = f'unsupported apiVersion "{api_version}" for kind {kind}: use {quoted_choices(versions)}'
        raise JobValidationError([("apiVersion", message)], subject)
    return model.from_manifest(doc)


def parse_manifests(text: str) -> list[Manifest]:
    """Validate every document of a multi-document YAML string (a `kind: List` is unpacked).

    All invalid documents are reported together, each named by its position and kind/name.
    """
    try:
        import yaml  # here: only the CLI and rules files read YAML; the functions' cold start skips it

        documents = [doc for doc in yaml.safe_load_all(text) if doc is not None]
    except yaml.YAMLError as e:
        raise JobValidationError([("", f"invalid YAML: {e}")]) from None
    items: list[Any] = []
    for doc in documents:
        unpack = isinstance(doc, Mapping) and doc.get("kind") == "List" and isinstance(doc.get("items"), list)
        items.extend(doc["items"] if unpack else [doc])
    manifests: list[Manifest] = []
    failures: list[JobValidationError] = []
    for number, doc in enumerate(items, start=1):
        try:
            manifests.append(parse_manifest(doc))
        except JobValidationError as e:
            where = f"document {number}" + (f" ({e.subject})" if e.subject else "")
            failures.append(JobValidationError(e.errors, where))
    if failures:
        raise JobValidationError.combine(failures)
    return manifests
