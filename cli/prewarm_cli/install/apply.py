"""Applies rendered objects through the Kubernetes API, idempotently, and removes them again.

Each object carries the digest of what was rendered (`DIGEST_ANNOTATION`, as kubectl keeps its
last-applied configuration): the same digest means unchanged and nothing is written, so a re-run
neither bumps resource versions nor restarts the DaemonSet. Objects an earlier install made that
the new render no longer holds (a namespace dropped from the pull-secret namespaces) are deleted.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from prewarm_cli.install.render import KIND_PLURALS, MANAGED_BY

__all__ = ["DIGEST_ANNOTATION", "Change", "ObjectApi", "install", "uninstall"]

DIGEST_ANNOTATION = "prewarm.dev/applied-digest"
CRD_KIND = "CustomResourceDefinition"

Obj = dict[str, Any]


class ObjectApi(Protocol):
    """What install needs of a cluster (`prewarm.adapters.kube.KubeCluster` is one)."""

    def get_object(self, api_version: str, plural: str, name: str, namespace: str | None = None) -> Obj | None: ...

    def list_objects(self, api_version: str, plural: str, namespace: str | None = None,
                     label_selector: str | None = None) -> list[Obj]: ...

    def create_object(self, api_version: str, plural: str, body: Obj, namespace: str | None = None) -> Obj: ...

    def replace_object(self, api_version: str, plural: str, name: str, body: Obj,
                       namespace: str | None = None) -> Obj: ...

    def delete_object(self, api_version: str, plural: str, name: str, namespace: str | None = None) -> bool: ...


@dataclass(frozen=True)
class Change:
    """One object and what happened to it, worded as kubectl words it: `clusterrole.rbac.../x created`."""

    kind: str
    name: str
    namespace: str | None
    action: str  # created, configured, unchanged, deleted

    def __str__(self) -> str:
        api_version = KIND_PLURALS[self.kind][0]
        group = api_version.split("/")[0] if "/" in api_version else ""
        resource = self.kind.lower() + (f".{group}" if group else "")
        where = f" (namespace {self.namespace})" if self.namespace else ""
        return f"{resource}/{self.name} {self.action}{where}"


def digest(obj: Obj) -> str:
    canonical = json.dumps(obj, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()[:32]


def _where(obj: Obj) -> tuple[str, str, str, str | None]:
    api_version, plural, namespaced = KIND_PLURALS[obj["kind"]]
    namespace = obj["metadata"].get("namespace") if namespaced else None
    return api_version, plural, obj["metadata"]["name"], namespace


def install(
    api: ObjectApi, objects: Sequence[Obj], *, report: Callable[[Change], None] = lambda c: None
) -> list[Change]:
    """Creates or replaces each object in order, then deletes what an earlier install left that is gone now."""
    changes: list[Change] = []
    wanted: set[tuple[str, str, str | None]] = set()
    for obj in objects:
        api_version, plural, name, namespace = _where(obj)
        wanted.add((obj["kind"], name, namespace))
        body = json.loads(json.dumps(obj))
        body["metadata"].setdefault("annotations", {})[DIGEST_ANNOTATION] = digest(obj)
        current = api.get_object(api_version, plural, name, namespace)
        if current is None:
            api.create_object(api_version, plural, body, namespace)
            action = "created"
        elif (current["metadata"].get("annotations") or {}).get(DIGEST_ANNOTATION) == body["metadata"]["annotations"][
                DIGEST_ANNOTATION]:
            action = "unchanged"
        else:
            body["metadata"]["resourceVersion"] = current["metadata"]["resourceVersion"]
            api.replace_object(api_version, plural, name, body, namespace)
            action = "configured"
        change = Change(obj["kind"], name, namespace, action)
        report(change)
        changes.append(change)
    for kind, name, namespace in _installed(api):
        if (kind, name, namespace) not in wanted:
            changes.append(_delete(api, kind, name, namespace, report))
    return changes


def uninstall(
    api: ObjectApi, *, include_crds: bool = False, report: Callable[[Change], None] = lambda c: None
) -> list[Change]:
    """Deletes every object an install made, dependents first; nothing else is touched.

    The CustomResourceDefinitions stay unless `include_crds`: deleting one deletes every resource of it,
    the users' jobs and rules, which reinstalling would not bring back.
    """
    order = list(KIND_PLURALS)
    found = sorted((k for k in _installed(api) if include_crds or k[0] != CRD_KIND),
                   key=lambda k: order.index(k[0]), reverse=True)
    return [_delete(api, kind, name, namespace, report) for kind, name, namespace in found]


def _installed(api: ObjectApi) -> Iterable[tuple[str, str, str | None]]:
    selector = f"{MANAGED_BY[0]}={MANAGED_BY[1]}"
    for kind, (api_version, plural, namespaced) in KIND_PLURALS.items():
        for obj in api.list_objects(api_version, plural, None, selector):
            yield kind, obj["metadata"]["name"], obj["metadata"].get("namespace") if namespaced else None


def _delete(api: ObjectApi, kind: str, name: str, namespace: str | None, report: Callable[[Change], None]) -> Change:
    api_version, plural, _ = KIND_PLURALS[kind]
    api.delete_object(api_version, plural, name, namespace)
    change = Change(kind, name, namespace, "deleted")
    report(change)
    return change
