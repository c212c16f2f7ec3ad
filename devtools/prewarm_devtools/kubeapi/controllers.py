"""The registry's state and its writes, and what the controllers do after a write, done at once: ClusterRole
aggregation, the types of an established CRD served (or a deleted CRD's cleanup finished), a new
namespace's default service account. The verbs build on it: deletion.py, then registry.py."""

from __future__ import annotations

import json
import random
import time
import uuid
from collections.abc import Callable
from typing import Any

from prewarm_devtools.kubeapi import errors
from prewarm_devtools.kubeapi.admission import AdmissionPolicies, Write
from prewarm_devtools.kubeapi.auth import Identity
from prewarm_devtools.kubeapi.catalog import Catalog
from prewarm_devtools.kubeapi.crd import CLEANUP_FINALIZER, is_established, is_terminating
from prewarm_devtools.kubeapi.customresources import CUSTOM_RESOURCE_DEFINITIONS, custom_resource_types
from prewarm_devtools.kubeapi.rbac import aggregated_rules
from prewarm_devtools.kubeapi.resources.rbac import CLUSTER_ROLES
from prewarm_devtools.kubeapi.resources.types import ResourceType
from prewarm_devtools.kubeapi.store import Store, Stored

Obj = dict[str, Any]


def now_rfc3339(clock: Callable[[], float] = time.time) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(clock()))


class Controllers:
    """The registry's store, catalog, clock and admission, and its writes with what follows them."""

    def __init__(
        self,
        store: Store,
        clock: Callable[[], float] = time.time,
        seed: int | None = None,
        catalog: Catalog | None = None,
    ) -> None:
        self.store = store
        self.catalog = catalog or Catalog()
        self._clock = clock
        self._random = random.Random(seed)
        self.admission = AdmissionPolicies(store, self.catalog.by_kind)

    def _admit(self, user: Identity | None, write: Callable[[Identity], Write], warnings: list[str] | None) -> None:
        """Validating admission policies, for writes a client makes (`user`; None: the server's own):
        raises the denial, adds the warnings."""
        if user is None:
            return
        found = self.admission.admit(write(user))
        if warnings is not None:
            warnings.extend(found)

    @staticmethod
    def key(rtype: ResourceType, namespace: str | None, name: str) -> str:
        return f"{namespace}/{name}" if rtype.namespaced else name

    def _get(self, rtype: ResourceType, namespace: str | None, name: str) -> Stored:
        stored = self.store.get(rtype.storage, self.key(rtype, namespace, name))
        if stored is None:
            raise errors.not_found(rtype.name, name, rtype.group)
        return stored

    def _require_namespace(self, namespace: str) -> Stored:
        stored = self.store.get("namespaces", namespace)
        if stored is None:
            raise errors.not_found("namespaces", namespace)
        return stored

    def _uid(self) -> str:
        return str(uuid.UUID(int=self._random.getrandbits(128), version=4))

    def _write(self, rtype: ResourceType, key: str, obj: Obj | None) -> Stored:
        """Store (or, with None, remove) an object, and do what follows from that for CRDs and their objects."""
        stored = self.store.write(rtype.storage, key, obj)
        if rtype is CLUSTER_ROLES:
            self._aggregate_cluster_roles()
        if rtype is CUSTOM_RESOURCE_DEFINITIONS:
            self._define(key)
        elif obj is None and rtype.custom is not None:
            self._finish_definition(rtype.custom.definition)
        return stored

    def _aggregate_cluster_roles(self) -> None:
        """The ClusterRole aggregation controller's work, done at once: each role with an aggregationRule
        holds the rules of the roles its selectors match (a write of the role's own, so a watch sees it)."""
        roles = [entry.obj for entry in self.store.snapshot(CLUSTER_ROLES.storage).entries]
        for name, rules in aggregated_rules(roles).items():
            current = self.store.get(CLUSTER_ROLES.storage, name)
            if current is not None:
                self.store.write(CLUSTER_ROLES.storage, name, {**json.loads(current.raw), "rules": rules})

    def _group_definitions(self, crd: Obj) -> list[Obj]:
        group = (crd.get("spec") or {}).get("group")
        snapshot = self.store.snapshot(CUSTOM_RESOURCE_DEFINITIONS.storage)
        return [e.obj for e in snapshot.entries if (e.obj.get("spec") or {}).get("group") == group]

    def _define(self, name: str) -> None:
        """Serve what the CRD `name` defines now: its established versions, or nothing once it is gone."""
        stored = self.store.get(CUSTOM_RESOURCE_DEFINITIONS.storage, name)
        types = custom_resource_types(stored.obj) if stored is not None and is_established(stored.obj) else []
        for rtype in types:
            self.store.add_resource(rtype.storage, rtype.field_values)
        self.catalog.define(name, types)

    def _finish_definition(self, name: str) -> None:
        """The CRD cleanup finalizer's last step: a terminating CRD whose objects are all gone goes too."""
        stored = self.store.get(CUSTOM_RESOURCE_DEFINITIONS.storage, name)
        if stored is None or not is_terminating(stored.obj):
            return
        types = self.catalog.definition(name)
        if types and self.store.snapshot(types[0].storage).keys:
            return
        crd = json.loads(stored.raw)
        finalizers = [f for f in crd["metadata"].get("finalizers") or [] if f != CLEANUP_FINALIZER]
        crd["metadata"]["finalizers"] = finalizers
        conditions = crd.get("status", {}).get("conditions") or []
        for i, found in enumerate(conditions):
            if found.get("type") == "Terminating":
                conditions[i] = {
                    **found,
                    "reason": "InstanceDeletionCompleted",
                    "message": "removed all instances",
                    "lastTransitionTime": now_rfc3339(self._clock),
                }
        self._write(CUSTOM_RESOURCE_DEFINITIONS, name, crd if finalizers else None)

    def _ensure_default_service_account(self, namespace: str) -> None:
        # The service account controller gives every namespace a `default` account.
        key = f"{namespace}/default"
        if self.store.get("serviceaccounts", key) is None:
            account = {
                "kind": "ServiceAccount",
                "apiVersion": "v1",
                "metadata": {
                    "name": "default",
                    "namespace": namespace,
                    "uid": self._uid(),
                    "creationTimestamp": now_rfc3339(self._clock),
                },
            }
            self.store.write("serviceaccounts", key, account)
