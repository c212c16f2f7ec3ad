"""Resource requests: which resource a path names (`resolve`), what the query and body say (selectors,
paging, `dryRun`, `fieldValidation`, `fieldManager`, JSON or YAML bodies, DeleteOptions), and the registry
verb each method calls, answered in the representation the Accept header asks for (JSON, a Table, or the
metadata alone, watches included)."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

import yaml

from prewarm_devtools.kubeapi import errors
from prewarm_devtools.kubeapi.auth import Identity
from prewarm_devtools.kubeapi.catalog import Catalog
from prewarm_devtools.kubeapi.errors import FieldError
from prewarm_devtools.kubeapi.fieldvalidation import FIELD_VALIDATIONS
from prewarm_devtools.kubeapi.patch import APPLY_PATCH, CUSTOM_PATCH_TYPES, PATCH_TYPES
from prewarm_devtools.kubeapi.reads import ListQuery, list_collection, watch
from prewarm_devtools.kubeapi.registry import Registry
from prewarm_devtools.kubeapi.representation import PARTIAL, PARTIAL_LIST, TABLE, as_partial_metadata, negotiate
from prewarm_devtools.kubeapi.resources.types import ResourceType
from prewarm_devtools.kubeapi.selectors import FieldSelector, LabelSelector, SelectorParseError
from prewarm_devtools.kubeapi.store import dumps
from prewarm_devtools.kubeapi.table import to_table
from prewarm_devtools.kubeapi.transport import JSON, Response

YAML = "application/yaml"


class Serving(Protocol):
    """What the verbs need of the server: its registry and how long watches last."""

    registry: Registry
    watch_timeout: float
    bookmark_interval: float


@dataclass(frozen=True)
class Target:
    rtype: ResourceType
    namespace: str | None
    name: str | None
    subresource: str = ""


def group_version_of(parts: list[str], catalog: Catalog) -> str | None:
    """The served group version a path is under (`v1`, `rbac.authorization.k8s.io/v1`), or None."""
    if parts[:2] == ["api", "v1"]:
        return "v1"
    if len(parts) >= 3 and parts[0] == "apis" and catalog.served(f"{parts[1]}/{parts[2]}") is not None:
        return f"{parts[1]}/{parts[2]}"
    return None


def resolve(parts: list[str], served: Mapping[str, ResourceType]) -> Target | None:
    """What a path under a group version names, or None for no such resource."""
    if parts[0] == "namespaces" and len(parts) >= 3 and parts[2] in served:
        rtype = served[parts[2]]
        if not rtype.namespaced or len(parts) > 5:
            return None
        name = parts[3] if len(parts) > 3 else None
        sub = parts[4] if len(parts) > 4 else ""
        if sub and (sub != "status" or not rtype.has_status):
            return None
        return Target(rtype, parts[1], name, sub)
    found = served.get(parts[0])
    if found is None or len(parts) > 3:
        return None
    if len(parts) == 1:
        return Target(found, None, None)
    if found.namespaced:
        return None
    sub = parts[2] if len(parts) > 2 else ""
    if sub and (sub != "status" or not found.has_status):
        return None
    return Target(found, None, parts[1], sub)


def flag(query: dict[str, str], name: str) -> bool:
    value = query.get(name)
    if value is None or value == "":
        return False
    if value in ("1", "t", "T", "true", "TRUE", "True"):
        return True
    if value in ("0", "f", "F", "false", "FALSE", "False"):
        return False
    raise errors.bad_request(f'{name}: invalid value "{value}": must be true or false')


def int_option(query: dict[str, str], name: str) -> int:
    value = query.get(name, "")
    if not value:
        return 0
    try:
        return int(value)
    except ValueError:
        raise errors.bad_request(f'{name}: invalid value "{value}": must be an integer') from None


def parse_list_query(rtype: ResourceType, query: dict[str, str]) -> ListQuery:
    try:
        labels = LabelSelector.parse(query.get("labelSelector", ""))
        fields = FieldSelector.parse(query.get("fieldSelector", ""), rtype.convert_field)
    except SelectorParseError as e:
        raise errors.bad_request(str(e)) from None
    send_initial = flag(query, "sendInitialEvents") if query.get("sendInitialEvents") else None
    return ListQuery(
        label_selector=labels,
        field_selector=fields,
        limit=int_option(query, "limit"),
        continue_token=query.get("continue", ""),
        resource_version=query.get("resourceVersion", ""),
        resource_version_match=query.get("resourceVersionMatch", ""),
        send_initial_events=send_initial,
        allow_bookmarks=flag(query, "allowWatchBookmarks"),
    )


def field_validation(query: dict[str, str], options_kind: str) -> str:
    """What a write's unknown fields get (`fieldValidation`): Warn unless the request says otherwise."""
    value = query.get("fieldValidation", "")
    if value and value not in FIELD_VALIDATIONS:
        allowed = ", ".join(f'"{v}"' for v in ("", *FIELD_VALIDATIONS))
        problem = FieldError("NotSupported", "fieldValidation", value, f"supported values: {allowed}")
        raise errors.invalid(f"{options_kind}.meta.k8s.io", "", [problem])
    return value or "Warn"


def is_dry_run(query: dict[str, str], options: dict[str, Any] | None = None) -> bool:
    """Whether the request is a dry run: `?dryRun=All`, or `dryRun: ["All"]` in DeleteOptions."""
    value = query.get("dryRun", "")
    if value and value != "All":
        raise errors.bad_request(f'Unsupported value: "{value}": supported values: "All"')
    in_body = (options or {}).get("dryRun")
    if in_body:
        if not isinstance(in_body, list) or any(v != "All" for v in in_body):
            raise errors.invalid(
                "DeleteOptions.meta.k8s.io",
                "",
                [FieldError("NotSupported", "dryRun", in_body, 'supported values: "All"')],
            )
        return True
    return value == "All"


def events_as(stream: Iterator[bytes | None], transform: Callable[[dict[str, Any]], dict[str, Any]]
               ) -> Iterator[bytes | None]:
    """A watch whose event objects are shown as the Accept header asks, as the API server transforms them
    (not a BOOKMARK's, nor an ERROR's Status): a Table of the object's one row (`kubectl get -w` of custom
    resources), or its metadata alone (a metadata informer's PartialObjectMetadata)."""
    for line in stream:
        if not line:
            yield line
            continue
        event = json.loads(line)
        if event.get("type") in ("ADDED", "MODIFIED", "DELETED"):
            event["object"] = transform(event["object"])
            line = dumps(event) + b"\n"
        yield line


def field_manager(query: dict[str, str], headers: Any) -> str:
    """Who owns the fields a write sets: `fieldManager`, else the User-Agent's product, as the API server
    derives it (prefixFromUserAgent: up to the first '/', at most 128 characters)."""
    return query.get("fieldManager") or (headers.get("User-Agent") or "").split("/")[0][:128]


def decode_body(headers: Any, body: bytes) -> Any:
    content_type = (headers.get("Content-Type") or JSON).split(";")[0].strip().lower()
    if content_type in (JSON, "*/*", ""):
        try:
            return json.loads(body or b"null")
        except ValueError as e:
            raise errors.bad_request(f"couldn't get version/kind; json parse error: {e}") from None
    if content_type in (YAML, "application/x-yaml", "text/yaml"):
        try:
            return yaml.safe_load(body or b"")
        except yaml.YAMLError as e:
            raise errors.bad_request(f"error converting YAML to JSON: {e}") from None
    raise errors.unsupported_media_type(content_type, [JSON, YAML])


def delete_options(headers: Any, body: bytes, query: dict[str, str]) -> dict[str, Any]:
    """The DeleteOptions of the body, with what the query sets (`propagationPolicy`, `orphanDependents`), as
    the server's decoding merges them."""
    options = decode_body(headers, body) if body.strip() else {}
    if not isinstance(options, dict):
        raise errors.bad_request("DeleteOptions must be a JSON object")
    if "propagationPolicy" in query:
        options["propagationPolicy"] = query["propagationPolicy"]
    if "orphanDependents" in query:
        options["orphanDependents"] = query["orphanDependents"] in ("true", "1")
    return options


def serve_collection(
    api: Serving, method: str, target: Target, query: dict[str, str], headers: Any, body: bytes, watching: bool,
    identity: Identity,
) -> Response:
    """A request on a collection: list or watch (GET), create (POST), delete the collection (DELETE)."""
    rtype, namespace = target.rtype, target.namespace
    if method == "GET":
        list_query = parse_list_query(rtype, query)
        if watching:
            timeout = float(int_option(query, "timeoutSeconds") or api.watch_timeout)
            stream = watch(api.registry.store, rtype, namespace, list_query, timeout, api.bookmark_interval)
            wanted = negotiate(headers.get("Accept") or "")
            if wanted.kind == TABLE and rtype.custom is not None:
                include = query.get("includeObject", "")
                stream = events_as(stream, lambda obj: to_table(rtype, obj, wanted.version, include))
            elif wanted.kind == PARTIAL:
                stream = events_as(stream, lambda obj: as_partial_metadata(obj, wanted, is_list=False))
            return Response(200, stream=stream)
        return read(rtype, list_collection(api.registry.store, rtype, namespace, list_query), query, headers,
                          is_list=True)
    if method == "POST" and (namespace is not None or not rtype.namespaced):
        warnings: list[str] = []
        created = api.registry.create(
            rtype,
            namespace,
            decode_body(headers, body),
            dry_run=is_dry_run(query),
            field_validation=field_validation(query, "CreateOptions"),
            warnings=warnings,
            user=identity.authenticated(),
            manager=field_manager(query, headers),
        )
        return Response(201, dumps(created), warnings=warnings)
    if method == "DELETE" and "deletecollection" in rtype.verbs:
        options = delete_options(headers, body, query)
        return Response(
            200,
            api.registry.delete_collection(
                rtype, namespace, parse_list_query(rtype, query), options, dry_run=is_dry_run(query, options)
            ),
        )
    raise errors.method_not_allowed()


def serve_item(
    api: Serving, method: str, target: Target, query: dict[str, str], headers: Any, body: bytes, identity: Identity
) -> Response:
    """A request on one object (or its status): get, replace (PUT), patch or apply (PATCH), delete."""
    rtype, namespace, name, sub = target.rtype, target.namespace, target.name, target.subresource
    assert name is not None
    warnings: list[str] = []

    def write_options(kind: str) -> dict[str, Any]:
        """What a write's query says (`kind`: UpdateOptions or PatchOptions)."""
        return {"subresource": sub, "dry_run": is_dry_run(query), "field_validation": field_validation(query, kind),
                "warnings": warnings, "user": identity.authenticated()}

    if method == "GET":
        return read(rtype, api.registry.get(rtype, namespace, name), query, headers)
    if method == "PUT":
        replaced = api.registry.replace(rtype, namespace, name, decode_body(headers, body),
                                        manager=field_manager(query, headers), **write_options("UpdateOptions"))
        return Response(200, dumps(replaced), warnings=warnings)
    if method == "PATCH":
        content_type = (headers.get("Content-Type") or "").split(";")[0].strip().lower()
        accepted = CUSTOM_PATCH_TYPES if rtype.custom is not None else PATCH_TYPES
        if content_type not in accepted:
            raise errors.unsupported_media_type(content_type, list(accepted))
        if content_type == APPLY_PATCH:
            code, applied = api.registry.apply(
                rtype, namespace, name, decode_body({"Content-Type": YAML}, body),
                manager=query.get("fieldManager", ""), force=query.get("force") in ("true", "1"),
                **write_options("PatchOptions"),
            )
            return Response(code, dumps(applied), warnings=warnings)
        try:
            patch = json.loads(body or b"null")
        except ValueError as e:
            raise errors.bad_request(f"error decoding patch: {e}") from None
        patched = api.registry.patch(rtype, namespace, name, content_type, patch,
                                     manager=field_manager(query, headers), **write_options("PatchOptions"))
        return Response(200, dumps(patched), warnings=warnings)
    if method == "DELETE" and not sub:
        options = delete_options(headers, body, query)
        return Response(
            200,
            dumps(api.registry.delete(rtype, namespace, name, options, dry_run=is_dry_run(query, options),
                                       user=identity.authenticated())),
        )
    raise errors.method_not_allowed()


def read(
    rtype: ResourceType, body: bytes, query: dict[str, str], headers: Any, *, is_list: bool = False
) -> Response:
    """A GET's answer as the Accept header prefers: JSON, the metadata alone, or for a custom resource a
    Table (a built-in resource's Table is its JSON here: no table convertors for them)."""
    wanted = negotiate(headers.get("Accept") or "")
    if wanted.kind in (PARTIAL, PARTIAL_LIST):
        return Response(200, dumps(as_partial_metadata(json.loads(body), wanted, is_list=is_list)))
    if wanted.kind == TABLE and rtype.custom is not None:
        return Response(200, dumps(to_table(rtype, json.loads(body), wanted.version,
                                             query.get("includeObject", ""))))
    return Response(200, body)
