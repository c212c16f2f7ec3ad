"""prewarm.dev resources as the API server keeps them, in memory, for the resource sync's tests."""

from __future__ import annotations

import copy
import itertools
from collections.abc import Mapping
from typing import Any

from prewarm.services.ports import ClusterConflictError, ClusterNotFoundError

API = "prewarm.dev/v1alpha1"
PLURALS = {"imagepulljobs": "ImagePullJob", "imagelistpulljobs": "ImageListPullJob", "prewarmrules": "PrewarmRule",
           "warmsnapshots": "WarmSnapshot", "advancedcronjobs": "AdvancedCronJob"}


class FakeResources:
    """Custom resources as the API server keeps them for a CRD with a status subresource: spec changes bump
    `metadata.generation`, status writes do not, a stale resourceVersion is a conflict. Counts every call."""

    def __init__(self) -> None:
        self.objects: dict[tuple[str, str | None, str], dict[str, Any]] = {}
        self.versions = itertools.count(100)
        self.calls: list[str] = []
        self.missing: set[str] = set()
        # (namespace, name) → secret, for the pullSecretsOnly check; `secrets_error` is raised instead when set.
        self.secrets: dict[tuple[str, str], dict[str, Any]] = {}
        self.secrets_error: Exception | None = None

    def put(self, kind: str, name: str, spec: dict[str, Any], namespace: str | None = "default",
            **metadata: Any) -> dict[str, Any]:
        plural = {v: k for k, v in PLURALS.items()}[kind]
        key = (plural, namespace, name)
        current = self.objects.get(key)
        generation = 1 if current is None else current["metadata"]["generation"] + (current["spec"] != spec)
        meta = {"name": name, "generation": generation, "resourceVersion": str(next(self.versions)),
                "uid": f"uid-{name}", **metadata}
        if namespace:
            meta["namespace"] = namespace
        obj = {"apiVersion": API, "kind": kind, "metadata": meta, "spec": copy.deepcopy(spec),
               "status": (current or {}).get("status", {})}
        self.objects[key] = obj
        return obj

    def put_namespace(self, name: str, **annotations: str) -> None:
        """A Namespace, listed as `v1` `namespaces` (its warm budget's annotations)."""
        self.objects[("namespaces", None, name)] = {"apiVersion": "v1", "kind": "Namespace",
                                                    "metadata": {"name": name, "annotations": annotations}}

    def get(self, kind: str, name: str, namespace: str | None = "default") -> dict[str, Any]:
        plural = {v: k for k, v in PLURALS.items()}[kind]
        return self.objects[(plural, namespace, name)]

    def get_object(self, api_version: str, plural: str, name: str, namespace: str | None = None
                   ) -> dict[str, Any] | None:
        self.calls.append(f"get {plural}/{name}")
        return copy.deepcopy(self.objects.get((plural, namespace, name)))

    def create_object(self, api_version: str, plural: str, body: Mapping[str, Any], namespace: str | None = None
                      ) -> dict[str, Any]:
        self.calls.append(f"create {plural}/{body['metadata']['name']}")
        if (plural, namespace, body["metadata"]["name"]) in self.objects:
            raise ClusterConflictError(f'{plural} "{body["metadata"]["name"]}" already exists')
        meta = {k: v for k, v in body["metadata"].items() if k not in ("name", "namespace")}
        self.put(PLURALS[plural], body["metadata"]["name"], body["spec"], namespace, **meta)
        return copy.deepcopy(self.objects[(plural, namespace, body["metadata"]["name"])])

    def list_objects(self, api_version: str, plural: str, namespace: str | None = None,
                     label_selector: str | None = None) -> list[dict[str, Any]]:
        self.calls.append(f"list {plural}")
        if plural in self.missing:
            raise ClusterNotFoundError(f"{plural}: 404 NotFound")
        return [copy.deepcopy(o) for (p, _, _), o in sorted(self.objects.items(), key=lambda kv: str(kv[0]))
                if p == plural]

    def replace_status(self, api_version: str, plural: str, name: str, body: Mapping[str, Any],
                       namespace: str | None = None) -> dict[str, Any]:
        self.calls.append(f"status {plural}/{name}")
        current = self.objects.get((plural, namespace, name))
        if current is None:
            raise ClusterNotFoundError(name)
        if body["metadata"]["resourceVersion"] != current["metadata"]["resourceVersion"]:
            raise ClusterConflictError(f"{name}: the object has been modified")
        current["status"] = copy.deepcopy(body["status"])
        current["metadata"]["resourceVersion"] = str(next(self.versions))
        return current

    def get_secret(self, namespace: str, name: str) -> dict[str, Any] | None:
        self.calls.append(f"get secret {namespace}/{name}")
        if self.secrets_error is not None:
            raise self.secrets_error
        return copy.deepcopy(self.secrets.get((namespace, name)))

    def delete_object(self, api_version: str, plural: str, name: str, namespace: str | None = None) -> bool:
        self.calls.append(f"delete {plural}/{name}")
        return self.objects.pop((plural, namespace, name), None) is not None
