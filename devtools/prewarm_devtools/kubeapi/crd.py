"""A CustomResourceDefinition as the rest of the API reads it: its spec, names, versions and their
schemas, its storage version and its conditions."""

from __future__ import annotations

from typing import Any

Obj = dict[str, Any]

GROUP = "apiextensions.k8s.io"
CLEANUP_FINALIZER = "customresourcecleanup.apiextensions.k8s.io"


def spec_of(crd: Obj) -> Obj:
    spec = crd.get("spec")
    return spec if isinstance(spec, dict) else {}


def names_of(crd: Obj) -> Obj:
    names = spec_of(crd).get("names")
    return names if isinstance(names, dict) else {}


def versions_of(crd: Obj) -> list[Obj]:
    return [v for v in spec_of(crd).get("versions") or [] if isinstance(v, dict)]


def schema_of(version: Obj) -> Obj | None:
    schema = (version.get("schema") or {}).get("openAPIV3Schema")
    return schema if isinstance(schema, dict) else None


def has_status_subresource(version: Obj) -> bool:
    return isinstance((version.get("subresources") or {}).get("status"), dict)


def storage_version(crd: Obj) -> str:
    return next((str(v.get("name")) for v in versions_of(crd) if v.get("storage")), "")


def condition(crd: Obj, kind: str) -> Obj | None:
    conditions = (crd.get("status") or {}).get("conditions") or []
    return next((c for c in conditions if isinstance(c, dict) and c.get("type") == kind), None)


def is_established(crd: Obj) -> bool:
    found = condition(crd, "Established")
    return found is not None and found.get("status") == "True"


def is_terminating(crd: Obj) -> bool:
    return bool((crd.get("metadata") or {}).get("deletionTimestamp"))


