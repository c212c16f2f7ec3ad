"""The delete verbs, as the generic registry and the namespace, CRD cleanup and garbage collector controllers (done
at once) carry them out: preconditions, finalizers (an object held is only marked for deletion), the namespace cascade,
a CRD's objects deleted with it, the NamespaceLifecycle and system PriorityClass refusals, and a Status
or the object as the real registry answers."""

from __future__ import annotations

import json
from typing import Any

from prewarm_devtools.kubeapi import errors
from prewarm_devtools.kubeapi.admission import Write
from prewarm_devtools.kubeapi.auth import Identity
from prewarm_devtools.kubeapi.controllers import Controllers, now_rfc3339
from prewarm_devtools.kubeapi.customresources import CUSTOM_RESOURCE_DEFINITIONS, terminating
from prewarm_devtools.kubeapi.reads import ListQuery, list_collection, served_as
from prewarm_devtools.kubeapi.resources.core import NAMESPACES
from prewarm_devtools.kubeapi.resources.scheduling import PRIORITY_CLASSES, SYSTEM_PRIORITY_CLASSES
from prewarm_devtools.kubeapi.resources.types import ResourceType
from prewarm_devtools.kubeapi.store import Stored, dumps

Obj = dict[str, Any]

# Namespaces the NamespaceLifecycle admission plugin refuses to delete.
IMMORTAL_NAMESPACES = frozenset({"default", "kube-system", "kube-public"})
_SYSTEM_PRIORITY_CLASS_NAMES = frozenset(c["metadata"]["name"] for c in SYSTEM_PRIORITY_CLASSES)


class Deletion(Controllers):
    """DELETE of an object and of a collection."""

    def delete(
        self, rtype: ResourceType, namespace: str | None, name: str, options: Obj, *, dry_run: bool = False,
        user: Identity | None = None,
    ) -> Obj:
        """DELETE: the object (pods, service accounts, namespaces, anything with finalizers) or a Status."""
        with self.store.lock:
            stored = self._get(rtype, namespace, name)
            self._check_preconditions(rtype, stored, options)
            self._admit(user, lambda u: Write("DELETE", rtype, namespace, name, None, served_as(rtype, stored.obj), u,
                                              dry_run=dry_run), None)
            if rtype is NAMESPACES:
                if name in IMMORTAL_NAMESPACES:
                    # The NamespaceLifecycle admission plugin, which runs for dry runs too.
                    raise errors.forbidden_resource("namespaces", name, "", "this namespace may not be deleted")
                return self._delete_namespace(stored, dry_run)
            if rtype is PRIORITY_CLASSES and name in _SYSTEM_PRIORITY_CLASS_NAMES:
                raise errors.forbidden_resource(
                    rtype.name, name, rtype.group, "this is a system priority class and cannot be deleted"
                )
            if rtype is CUSTOM_RESOURCE_DEFINITIONS:
                return self._delete_definition(stored, dry_run)
            key = self.key(rtype, namespace, name)
            answer = self._delete(rtype, key, stored, dry_run)
            if not dry_run and self.store.get(rtype.storage, key) is None:
                orphan = options.get("propagationPolicy") == "Orphan" or options.get("orphanDependents") is True
                self._collect_garbage(stored.obj, orphan=orphan)
            return answer

    def _collect_garbage(self, owner: Obj, *, orphan: bool = False) -> None:
        """The garbage collector's work, done at once, for an owner that went (not one finalizers hold): the
        objects whose ownerReferences name its uid are deleted, in turn collecting theirs, unless they have
        another owner (assumed present) or the delete said `Orphan`: then only the reference goes.
        `Foreground` ends as `Background` does, the owner gone first."""
        uid, namespace = owner["metadata"].get("uid"), owner["metadata"].get("namespace")
        for rtype in self.catalog.stored_types() if uid else ():
            if namespace and not rtype.namespaced:
                continue  # a namespaced owner owns objects of its namespace only
            snapshot = self.store.snapshot(rtype.storage)
            lo, hi = snapshot.bounds(f"{namespace}/" if namespace else "")
            for key, entry in zip(snapshot.keys[lo:hi], snapshot.entries[lo:hi], strict=True):
                refs = entry.obj["metadata"].get("ownerReferences") or []
                rest = [ref for ref in refs if ref.get("uid") != uid]
                if len(rest) == len(refs):
                    continue
                if rest or orphan:
                    obj = json.loads(entry.raw)
                    obj["metadata"]["ownerReferences"] = rest
                    if not rest:
                        del obj["metadata"]["ownerReferences"]
                    self._write(rtype, key, obj)
                    continue
                self._delete(rtype, key, entry, dry_run=False)
                if self.store.get(rtype.storage, key) is None:
                    self._collect_garbage(entry.obj)

    def _check_preconditions(self, rtype: ResourceType, stored: Stored, options: Obj) -> None:
        preconditions = options.get("preconditions") or {}
        metadata = stored.obj["metadata"]
        name = metadata["name"]
        uid, rv = preconditions.get("uid"), preconditions.get("resourceVersion")
        if uid and uid != metadata.get("uid"):
            raise errors.conflict(
                rtype.name,
                name,
                f"Precondition failed: UID in precondition: {uid}, UID in object meta: {metadata.get('uid')}",
                rtype.group,
            )
        if rv and rv != metadata.get("resourceVersion"):
            raise errors.conflict(
                rtype.name,
                name,
                f"Precondition failed: ResourceVersion in precondition: {rv}, ResourceVersion in object meta: "
                f"{metadata.get('resourceVersion')}",
                rtype.group,
            )

    def _delete(self, rtype: ResourceType, key: str, stored: Stored, dry_run: bool) -> Obj:
        metadata = stored.obj["metadata"]
        if metadata.get("finalizers"):
            # Finalizers hold the object: it is only marked for deletion.
            if metadata.get("deletionTimestamp") or dry_run:
                return stored.obj
            obj = json.loads(stored.raw)
            obj["metadata"]["deletionTimestamp"] = now_rfc3339(self._clock)
            obj["metadata"]["deletionGracePeriodSeconds"] = 0
            # Controllers must see the change of meaning (markAsDeleting in the generic store).
            if (obj["metadata"].get("generation") or 0) > 0:
                obj["metadata"]["generation"] += 1
            return served_as(rtype, self._write(rtype, key, obj).obj)
        gone = stored if dry_run else self._write(rtype, key, None)
        if rtype.returns_deleted_object:
            return served_as(rtype, gone.obj)
        return {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Success",
            "details": {
                "name": metadata["name"],
                **({"group": rtype.group} if rtype.group else {}),
                "kind": rtype.name,
                "uid": metadata.get("uid"),
            },
        }

    def _delete_namespace(self, stored: Stored, dry_run: bool) -> Obj:
        obj: Obj = json.loads(stored.raw)
        name = obj["metadata"]["name"]
        if not obj["metadata"].get("deletionTimestamp"):
            obj["metadata"]["deletionTimestamp"] = now_rfc3339(self._clock)
            obj["metadata"]["deletionGracePeriodSeconds"] = 0
        obj.setdefault("status", {})["phase"] = "Terminating"
        if dry_run:
            return obj
        answer = self.store.write("namespaces", name, obj).obj
        held = False
        # The namespace controller's work, done at once: delete the content, then the namespace.
        for rtype in self.catalog.stored_types():
            if rtype.namespaced:
                snapshot = self.store.snapshot(rtype.storage)
                lo, hi = snapshot.bounds(name + "/")
                for key, entry in zip(snapshot.keys[lo:hi], snapshot.entries[lo:hi], strict=True):
                    self._delete(rtype, key, entry, dry_run=False)
                    held = held or self.store.get(rtype.storage, key) is not None
        # Content or the namespace itself held by finalizers keeps it Terminating.
        if not held and not answer["metadata"].get("finalizers"):
            self.store.write("namespaces", name, None)
        return answer

    def _delete_definition(self, stored: Stored, dry_run: bool) -> Obj:
        """Delete a CRD: marked Terminating, then (the cleanup controller's work, done at once) its objects
        are deleted, and it goes when none is left (objects with finalizers hold it until released)."""
        crd: Obj = json.loads(stored.raw)
        name = crd["metadata"]["name"]
        terminating(crd, now_rfc3339(self._clock))
        if dry_run:
            return crd
        answer = self._write(CUSTOM_RESOURCE_DEFINITIONS, name, crd).obj if crd != stored.obj else stored.obj
        for rtype in self.catalog.definition(name)[:1]:
            snapshot = self.store.snapshot(rtype.storage)
            for key, entry in zip(snapshot.keys, snapshot.entries, strict=True):
                if self.store.get(rtype.storage, key) is not None:
                    self._delete(rtype, key, entry, dry_run=False)
        self._finish_definition(name)
        return answer

    def delete_collection(
        self, rtype: ResourceType, namespace: str | None, query: ListQuery, options: Obj, *, dry_run: bool = False
    ) -> bytes:
        """DELETE on a collection: the list of what was deleted."""
        with self.store.lock:
            page = json.loads(
                list_collection(self.store, rtype, namespace, ListQuery(query.label_selector, query.field_selector))
            )
            deleted = []
            for item in page["items"]:
                meta = item["metadata"]
                key = self.key(rtype, meta.get("namespace"), meta["name"])
                stored = self.store.get(rtype.storage, key)
                if stored is None:
                    continue
                self._check_preconditions(rtype, stored, options)
                self._delete(rtype, key, stored, dry_run)
                if not dry_run and self.store.get(rtype.storage, key) is None:
                    self._collect_garbage(stored.obj, orphan=options.get("propagationPolicy") == "Orphan")
                deleted.append(item)
            page["items"] = deleted
            page["metadata"] = {"resourceVersion": str(self.store.rv)}
            return dumps(page)
