"""The write verbs of the API, as the generic registry of the API server carries them out.

Create (generateName, namespace existence, admission, the storage's refusal of a resourceVersion), replace
(optimistic concurrency on `metadata.resourceVersion`, immutable fields, status kept off the main
resource, a no-op write is not a write), patch (three formats), server-side apply of custom resources,
and seeding. Bodies are decoded as fieldvalidation.py says; a custom resource is stored in its CRD's
storage version and read in any served one (reads.py). Deletion (deletion.py) and the controllers'
work after a write (controllers.py) are what `Registry` builds on.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from functools import partial
from typing import Any

from prewarm_devtools.kubeapi import errors
from prewarm_devtools.kubeapi import serversideapply as ssa
from prewarm_devtools.kubeapi.admission import Write
from prewarm_devtools.kubeapi.auth import Identity
from prewarm_devtools.kubeapi.builtindecoding import GoDecodeError, decode_json
from prewarm_devtools.kubeapi.builtintypes import kind_type
from prewarm_devtools.kubeapi.controllers import now_rfc3339
from prewarm_devtools.kubeapi.crd import is_terminating, storage_version
from prewarm_devtools.kubeapi.customresources import CUSTOM_RESOURCE_DEFINITIONS, definition_status
from prewarm_devtools.kubeapi.deletion import Deletion
from prewarm_devtools.kubeapi.errors import FieldError, GoSyntax, StatusError
from prewarm_devtools.kubeapi.fieldvalidation import decode_object, decode_patched, decode_typed
from prewarm_devtools.kubeapi.patch import (
    MERGE_PATCH,
    STRATEGIC_MERGE_PATCH,
    json_patch,
    merge_patch,
    strategic_merge_patch,
)
from prewarm_devtools.kubeapi.reads import raw_served_as, served_as
from prewarm_devtools.kubeapi.resources.core import NAMESPACES
from prewarm_devtools.kubeapi.resources.scheduling import PRIORITY_CLASSES, SCHEDULING_GROUP
from prewarm_devtools.kubeapi.resources.types import ResourceType
from prewarm_devtools.kubeapi.schema import prune
from prewarm_devtools.kubeapi.store import Stored

Obj = dict[str, Any]

_NAME_SUFFIX_ALPHABET = "bcdfghjklmnpqrstvwxz2456789"


class SeedError(ValueError):
    """An object given to seed the store cannot be stored; the message names the object and why."""


def _without_rv(obj: Obj) -> Obj:
    metadata = dict(obj.get("metadata") or {})
    metadata.pop("resourceVersion", None)
    return {**obj, "metadata": metadata}


def _to_storage(rtype: ResourceType, obj: Obj) -> None:
    # Conversion strategy None: versions differ by apiVersion alone.
    if rtype.custom is not None:
        obj["apiVersion"] = f"{rtype.group}/{rtype.custom.storage_version}"


class Registry(Deletion):
    """The verbs of the API over a `Store`."""

    def check_body(self, rtype: ResourceType, body: Any) -> Obj:
        if not isinstance(body, dict):
            raise errors.bad_request(
                f'{rtype.kind} in version "{rtype.version}" cannot be handled as a {rtype.kind}: '
                "the body must be a JSON object"
            )
        kind, api_version = body.get("kind"), body.get("apiVersion")
        if api_version not in (None, "", rtype.api_version):
            raise errors.bad_request(
                f"the API version in the data ({api_version}) does not match the expected API version "
                f"({rtype.api_version})"
            )
        if kind not in (None, "", rtype.kind):
            raise errors.bad_request(
                f'{kind} in version "{rtype.version}" cannot be handled as a {rtype.kind}: '
                f"the kind in the body does not match the resource {rtype.name}"
            )
        body["kind"], body["apiVersion"] = rtype.kind, rtype.api_version
        metadata = body.setdefault("metadata", {})
        if not isinstance(metadata, dict):
            raise errors.bad_request(
                f'{rtype.kind} in version "{rtype.version}" cannot be handled as a {rtype.kind}: '
                "metadata must be an object"
            )
        return body

    def _scope(self, rtype: ResourceType, namespace: str | None, metadata: Obj) -> None:
        if rtype.namespaced:
            given = metadata.get("namespace")
            if given and given != namespace:
                raise errors.bad_request(
                    "the namespace of the provided object does not match the namespace sent on the request"
                )
            metadata["namespace"] = namespace
        else:
            metadata.pop("namespace", None)

    def _validate(self, rtype: ResourceType, obj: Obj, old: Obj | None, subresource: str = "") -> None:
        if subresource == "status" and old is not None and rtype.validate_status is not None:
            problems = rtype.validate_status(obj, old)
        else:
            problems = rtype.full_validation(obj, old)
        if problems:
            raise errors.invalid(rtype.kind, str(obj["metadata"].get("name") or ""), problems, rtype.group)

    # -- create --------------------------------------------------------------------------------------

    def create(
        self,
        rtype: ResourceType,
        namespace: str | None,
        body: Any,
        *,
        dry_run: bool = False,
        field_validation: str = "Warn",
        warnings: list[str] | None = None,
        user: Identity | None = None,
        manager: str = "",
        managed_fields: list[Obj] | None = None,
    ) -> Obj:
        """POST: the created object (201); `warnings` gets what the answer's Warning headers say. `user`:
        the caller, whose write passes the validating admission policies (None: the server's own);
        `manager` owns the fields it wrote (`managed_fields`: the ownership an apply computed)."""
        obj = self.check_body(rtype, body)
        metadata = obj["metadata"]
        self._scope(rtype, namespace, metadata)
        decode_typed(rtype, obj, field_validation, warnings)
        decode_object(rtype, obj, field_validation, warnings)
        _to_storage(rtype, obj)
        with self.store.lock:
            if rtype.namespaced:
                assert namespace is not None
                self._require_namespace(namespace)
            if not metadata.get("name") and metadata.get("generateName"):
                metadata["name"] = self._generated_name(rtype, namespace, str(metadata["generateName"]))
            for system_field in ("uid", "creationTimestamp", "deletionTimestamp", "deletionGracePeriodSeconds"):
                metadata.pop(system_field, None)
            rtype.prepare_for_create(obj)
            self._validate(rtype, obj, None)
            name = metadata["name"]
            key = self.key(rtype, namespace, name)
            if self.store.get(rtype.storage, key) is not None:
                raise errors.already_exists(rtype.name, name, rtype.group)
            if rtype.kind == "Pod":
                self._admit_pod(obj, namespace or "")
            if rtype is PRIORITY_CLASSES:
                self._admit_priority_class(obj, creating=True)
            if rtype.custom is not None:
                self._admit_custom_resource(rtype, name)
            metadata["uid"] = self._uid()
            metadata["creationTimestamp"] = now_rfc3339(self._clock)
            self._own(rtype, obj, None, manager, managed_fields)
            if rtype is CUSTOM_RESOURCE_DEFINITIONS:
                definition_status(obj, self._group_definitions(obj), metadata["creationTimestamp"])
            self._admit(user, lambda u: Write("CREATE", rtype, namespace, name, served_as(rtype, obj), None, u,
                                              dry_run=dry_run), warnings)
            if dry_run:
                return served_as(rtype, obj)
            if _parse_uint(metadata.get("resourceVersion")):
                # etcd3's store refuses it (after validation and admission, never on a dry run) with a plain
                # error, which the API answers as 500 with no reason.
                raise StatusError(500, "", "resourceVersion should not be set on objects to be created")
            stored = self._write(rtype, key, obj)
            if rtype is NAMESPACES:
                self._ensure_default_service_account(name)
            return served_as(rtype, stored.obj)

    def _generated_name(self, rtype: ResourceType, namespace: str | None, prefix: str) -> str:
        # The real server retries a taken generated name a few times before AlreadyExists.
        prefix = prefix[: 63 - 5] if rtype.name_is_label else prefix[: 253 - 5]
        for _ in range(8):
            name = prefix + "".join(self._random.choice(_NAME_SUFFIX_ALPHABET) for _ in range(5))
            if self.store.get(rtype.storage, self.key(rtype, namespace, name)) is None:
                return name
        raise errors.already_exists(rtype.name, name, rtype.group)

    def _admit_pod(self, pod: Obj, namespace: str) -> None:
        account = pod["spec"].get("serviceAccountName") or "default"
        if self.store.get("serviceaccounts", f"{namespace}/{account}") is None:
            name = pod["metadata"]["name"]
            raise errors.forbidden(
                f'pods "{name}" is forbidden: error looking up service account {namespace}/{account}: '
                f'serviceaccount "{account}" not found',
                {"name": name, "kind": "pods"},
            )

    def _admit_priority_class(self, obj: Obj, *, creating: bool) -> None:
        # The Priority admission plugin: one globalDefault class at most (the lowest wins a race).
        if not obj.get("globalDefault"):
            return
        snapshot = self.store.snapshot(PRIORITY_CLASSES.name)
        defaults = [e.obj for e in snapshot.entries if e.obj.get("globalDefault")]
        if not defaults:
            return
        current = min(defaults, key=lambda c: int(c.get("value") or 0))["metadata"]["name"]
        name = obj["metadata"]["name"]
        if creating or current != name:
            raise errors.forbidden_resource(
                PRIORITY_CLASSES.name,
                name,
                SCHEDULING_GROUP,
                f"PriorityClass {current} is already marked as default. Only one default can exist",
            )

    def _admit_custom_resource(self, rtype: ResourceType, name: str) -> None:
        # The CRD handler refuses new objects while their definition is being deleted.
        assert rtype.custom is not None
        crd = self.store.get(CUSTOM_RESOURCE_DEFINITIONS.storage, rtype.custom.definition)
        if crd is None or is_terminating(crd.obj):
            raise errors.forbidden_resource(
                rtype.name, name, rtype.group, "create not allowed while custom resource definition is terminating"
            )

    # -- read ----------------------------------------------------------------------------------------

    def get(self, rtype: ResourceType, namespace: str | None, name: str) -> bytes:
        """GET of one object: its JSON, in the version asked for."""
        return raw_served_as(rtype, self._get(rtype, namespace, name).raw)

    # -- replace and patch ---------------------------------------------------------------------------

    def replace(
        self,
        rtype: ResourceType,
        namespace: str | None,
        name: str,
        body: Any,
        *,
        subresource: str = "",
        dry_run: bool = False,
        field_validation: str = "Warn",
        warnings: list[str] | None = None,
        user: Identity | None = None,
        manager: str = "",
    ) -> Obj:
        """PUT: the stored object after the update; `warnings` gets what the answer's Warning headers say."""
        obj = self.check_body(rtype, body)
        decode_typed(rtype, obj, field_validation, warnings)
        with self.store.lock:
            old = self._get(rtype, namespace, name)
            decode = partial(decode_object, rtype, field_validation=field_validation, warnings=warnings)
            return self._update(rtype, namespace, name, old, obj, subresource, dry_run, decode,
                                user=user, warnings=warnings, manager=manager)

    def patch(
        self,
        rtype: ResourceType,
        namespace: str | None,
        name: str,
        content_type: str,
        patch: Any,
        *,
        subresource: str = "",
        dry_run: bool = False,
        field_validation: str = "Warn",
        warnings: list[str] | None = None,
        user: Identity | None = None,
        manager: str = "",
    ) -> Obj:
        """PATCH in one of the three formats: the stored object after the update."""
        with self.store.lock:
            old = self._get(rtype, namespace, name)
            current = served_as(rtype, json.loads(old.raw))
            if content_type == MERGE_PATCH:
                if not isinstance(patch, dict):
                    raise errors.bad_request("merge patch must be a JSON object")
                patched = merge_patch(current, patch)
            elif content_type == STRATEGIC_MERGE_PATCH:
                patched = strategic_merge_patch(current, patch, rtype.merge_lists)
            else:
                patched = json_patch(current, patch)
            decode_patched(rtype, content_type, patch, patched, field_validation, warnings)
            requested_rv = (patch.get("metadata") or {}).get("resourceVersion") if isinstance(patch, dict) else None
            if requested_rv is None:
                # A patch without a resourceVersion applies to whatever is current.
                patched.setdefault("metadata", {})["resourceVersion"] = old.obj["metadata"]["resourceVersion"]
            decode = partial(decode_object, rtype, field_validation=field_validation, warnings=warnings, patching=True)
            return self._update(
                rtype, namespace, name, old, self.check_body(rtype, patched), subresource, dry_run, decode,
                user=user, warnings=warnings, manager=manager,
            )

    def _update(
        self,
        rtype: ResourceType,
        namespace: str | None,
        name: str,
        old: Stored,
        obj: Obj,
        subresource: str,
        dry_run: bool,
        decode: Callable[[Obj], None],
        *,
        user: Identity | None = None,
        warnings: list[str] | None = None,
        manager: str = "",
        managed_fields: list[Obj] | None = None,
    ) -> Obj:
        metadata = obj["metadata"]
        body_name = metadata.get("name")
        if body_name and body_name != name:
            raise errors.bad_request(
                f"the name of the object ({body_name}) does not match the name on the URL ({name})"
            )
        metadata["name"] = name
        self._scope(rtype, namespace, metadata)
        _to_storage(rtype, obj)
        wanted_rv = metadata.get("resourceVersion")
        if not wanted_rv and not rtype.unconditional_update:
            # The generic store's check, worded with the resource for the kind.
            problem = FieldError(
                "Invalid", "metadata.resourceVersion", GoSyntax("0"), "must be specified for an update"
            )
            raise errors.invalid(rtype.name, name, [problem], rtype.group)
        if wanted_rv and str(wanted_rv) != old.obj["metadata"]["resourceVersion"]:
            raise errors.conflict(rtype.name, name, errors.STALE_OBJECT, rtype.group)
        old_obj = json.loads(old.raw)
        old_meta = old_obj["metadata"]
        if metadata.get("uid") and metadata["uid"] != old_meta.get("uid"):
            raise errors.invalid(
                rtype.kind,
                name,
                [FieldError("Invalid", "metadata.uid", metadata["uid"], "field is immutable")],
                rtype.group,
            )
        # Clients cannot set these on update; generation moves only by the type's own rules.
        for system_field in (
            "uid",
            "creationTimestamp",
            "deletionTimestamp",
            "deletionGracePeriodSeconds",
            "generateName",
            "generation",
        ):
            if system_field in old_meta:
                metadata[system_field] = old_meta[system_field]
            else:
                metadata.pop(system_field, None)
        decode(obj)
        if subresource == "status":
            # A status write changes the status only.
            status = obj.get("status")
            obj = (
                {**old_obj, "status": status}
                if status is not None
                else {k: v for k, v in old_obj.items() if k != "status"}
            )
        else:
            if rtype.has_status:
                if "status" in old_obj:
                    obj["status"] = old_obj["status"]
                else:
                    obj.pop("status", None)
            rtype.prepare_for_update(obj, old_obj)
        self._own(rtype, obj, old_obj, manager, managed_fields, subresource)
        finalizers = obj["metadata"].get("finalizers") or []
        if old_meta.get("deletionTimestamp") and any(f not in (old_meta.get("finalizers") or []) for f in finalizers):
            raise errors.invalid(
                rtype.kind,
                name,
                [
                    FieldError(
                        "Forbidden",
                        "metadata.finalizers",
                        detail="no new finalizers can be added if the object is being deleted",
                    )
                ],
                rtype.group,
            )
        self._validate(rtype, obj, old_obj, subresource)
        if rtype is PRIORITY_CLASSES:
            self._admit_priority_class(obj, creating=False)
        self._admit(user, lambda u: Write("UPDATE", rtype, namespace, name, served_as(rtype, obj),
                                          served_as(rtype, old_obj), u, subresource=subresource, dry_run=dry_run),
                    warnings)
        if rtype is CUSTOM_RESOURCE_DEFINITIONS and subresource != "status":
            definition_status(obj, self._group_definitions(obj), now_rfc3339(self._clock))
        if _without_rv(obj) == _without_rv(old.obj):
            # A no-op write is not a write: no new resourceVersion, no watch event.
            return served_as(rtype, old.obj)
        if dry_run:
            return served_as(rtype, obj)
        key = self.key(rtype, namespace, name)
        stored = self._write(rtype, key, obj)
        if old_meta.get("deletionTimestamp") and not finalizers:
            # The last finalizer is gone from an object being deleted: it goes now.
            self._write(rtype, key, None)
        return served_as(rtype, stored.obj)

    def _own(self, rtype: ResourceType, obj: Obj, old: Obj | None, manager: str, managed: list[Obj] | None,
             subresource: str = "") -> None:
        """Field ownership of a custom resource after a write: an apply's, or the writer's changes (a write
        without a manager, the server's own, leaves it as it was). Built-in types keep none."""
        metadata = obj["metadata"]
        if rtype.custom is None:
            return
        if managed is None and manager:
            managed = ssa.record_update(old, obj, rtype.custom.schema, manager, rtype.api_version,
                                        now_rfc3339(self._clock), subresource)
        elif managed is None:
            managed = ((old or {}).get("metadata") or {}).get("managedFields") or []
        if managed:
            metadata["managedFields"] = managed
        else:
            metadata.pop("managedFields", None)

    def apply(
        self,
        rtype: ResourceType,
        namespace: str | None,
        name: str,
        body: Any,
        *,
        manager: str,
        force: bool = False,
        subresource: str = "",
        dry_run: bool = False,
        field_validation: str = "Strict",
        warnings: list[str] | None = None,
        user: Identity | None = None,
    ) -> tuple[int, Obj]:
        """Server-side apply (a custom resource's PATCH with application/apply-patch+yaml): the code (201
        when it created the object) and the object."""
        assert rtype.custom is not None
        if not manager:
            raise errors.invalid("PatchOptions.meta.k8s.io", "", [
                FieldError("Required", "fieldManager", detail="is required for apply patch")])
        config = self.check_body(rtype, body)
        if config["metadata"].get("name") not in (None, name):
            raise errors.bad_request(
                f"the name of the object ({config['metadata']['name']}) does not match the name on the URL ({name})")
        config["metadata"]["name"] = name
        self._scope(rtype, namespace, config["metadata"])
        unknown = prune(config, rtype.custom.schema)
        if unknown and field_validation == "Strict":
            raise errors.bad_request("strict decoding error: " + ", ".join(f'unknown field "{p}"' for p in unknown))
        if warnings is not None and field_validation == "Warn":
            warnings.extend(f'unknown field "{p}"' for p in unknown)
        with self.store.lock:
            stored = self.store.get(rtype.storage, self.key(rtype, namespace, name))
            live = served_as(rtype, json.loads(stored.raw)) if stored is not None else None
            try:
                result = ssa.apply(live, config, rtype.custom.schema, manager, rtype.api_version,
                                   now_rfc3339(self._clock), force=force, subresource=subresource)
            except ssa.ApplyConflict as e:
                causes = [{"reason": "FieldManagerConflict", "message": f"conflict with {ssa.manager_text(entry)}",
                           "field": ssa.path_text(path)} for entry, path in e.conflicts]
                raise StatusError(409, "Conflict", str(e), {"causes": causes}) from None
            managed = result["metadata"].pop("managedFields")
            if stored is None:
                result["metadata"].pop("resourceVersion", None)
                return 201, self.create(rtype, namespace, result, dry_run=dry_run, warnings=warnings, user=user,
                                        managed_fields=managed)
            result["metadata"]["resourceVersion"] = stored.obj["metadata"]["resourceVersion"]
            decode = partial(decode_object, rtype, field_validation="Ignore", warnings=None, patching=True)
            return 200, self._update(rtype, namespace, name, stored, result, subresource, dry_run, decode,
                                     user=user, warnings=warnings, managed_fields=managed)

    # -- seeding -------------------------------------------------------------------------------------

    def seed(self, objects: list[Obj]) -> int:
        """Store objects as given (status kept, resourceVersion renewed); namespaces made as needed, CRDs
        established before the objects they define."""
        prepared: list[tuple[int, Obj]] = []
        for index, original in enumerate(objects):
            kind = original.get("kind") if isinstance(original, dict) else None
            if not isinstance(original, dict) or not kind:
                raise SeedError(f"object #{index} has kind {kind!r}: {self._seedable()}")
            obj: Obj = json.loads(json.dumps(original))
            if not obj.setdefault("metadata", {}).get("name"):
                raise SeedError(f"{kind} #{index} has no metadata.name")
            prepared.append((index, obj))
        # Namespaces first, so that namespaced objects find theirs; CRDs next, so that their objects have a type.
        first = ("Namespace", CUSTOM_RESOURCE_DEFINITIONS.kind)
        prepared.sort(key=lambda pair: first.index(pair[1]["kind"]) if pair[1]["kind"] in first else len(first))
        with self.store.lock:
            for index, obj in prepared:
                rtype = self.catalog.by_kind(str(obj.get("apiVersion") or ""), str(obj["kind"]))
                if rtype is None:
                    raise SeedError(f"object #{index} has kind {obj['kind']!r}: {self._seedable()}")
                self._seed_one(rtype, obj)
        return len(prepared)

    def _seedable(self) -> str:
        kinds = sorted({t.kind for t in self.catalog.stored_types()})
        return f"only {', '.join(kinds)} (and the kinds of established CRDs) can be seeded"

    def _seed_one(self, rtype: ResourceType, obj: Obj) -> None:
        metadata = obj["metadata"]
        obj["apiVersion"] = rtype.api_version
        metadata.pop("resourceVersion", None)
        namespace = None
        if rtype.namespaced:
            namespace = metadata.get("namespace") or "default"
            metadata["namespace"] = namespace
            if self.store.get("namespaces", namespace) is None:
                self._seed_one(NAMESPACES, {"kind": "Namespace", "apiVersion": "v1", "metadata": {"name": namespace}})
        else:
            metadata.pop("namespace", None)
        go_type = kind_type(rtype.api_version, rtype.kind)
        if go_type is not None:
            # Seeded objects are what a real cluster could hold: decodable, no unknown fields.
            try:
                decoded = decode_json(go_type, obj)
            except GoDecodeError as e:
                raise SeedError(f"{rtype.kind} {metadata['name']!r} cannot be decoded: {e}") from None
            if decoded.strict:
                raise SeedError(f"{rtype.kind} {metadata['name']!r} has {', '.join(decoded.strict)}")
        rtype.decode(obj)
        _to_storage(rtype, obj)
        if rtype is NAMESPACES:
            obj.setdefault("spec", {"finalizers": ["kubernetes"]})
            obj.setdefault("status", {"phase": "Active"})
        key = self.key(rtype, namespace, metadata["name"])
        existing = self.store.get(rtype.storage, key)
        old_meta = existing.obj["metadata"] if existing is not None else {}
        metadata.setdefault("uid", old_meta.get("uid") or self._uid())
        metadata.setdefault("creationTimestamp", old_meta.get("creationTimestamp") or now_rfc3339(self._clock))
        if rtype is CUSTOM_RESOURCE_DEFINITIONS:
            # A CRD seeded without its controllers' status gets it, as if they had run.
            status = obj.setdefault("status", {})
            if not status.get("storedVersions"):
                status["storedVersions"] = [v for v in [storage_version(obj)] if v]
            definition_status(obj, self._group_definitions(obj), metadata["creationTimestamp"])
        problems = rtype.full_validation(obj, None)
        if problems:
            raise SeedError(f"{rtype.kind} {key!r} is invalid: {errors.aggregate(problems)}")
        self._write(rtype, key, obj)
        if rtype is NAMESPACES:
            self._ensure_default_service_account(metadata["name"])

    def remove(self, rtype: ResourceType, namespace: str | None, name: str) -> bool:
        """Delete an object outright (no finalizers, no cascade); whether it existed."""
        with self.store.lock:
            key = self.key(rtype, namespace, name)
            if self.store.get(rtype.storage, key) is None:
                return False
            self._write(rtype, key, None)
            return True


def _parse_uint(value: Any) -> int:
    """A resourceVersion as the storage versioner parses it (strconv.ParseUint); 0 when it does not parse."""
    text = str(value or "")
    return int(text) if text.isascii() and text.isdigit() else 0

