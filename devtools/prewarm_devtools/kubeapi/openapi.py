"""OpenAPI v3: the `/openapi/v3` index of group versions and one document per group version.

Every served resource has its paths and operations, with `x-kubernetes-group-version-kind`,
`x-kubernetes-action` and the query parameters (`fieldValidation` among them): kubectl (1.27 and
later) reads them to learn that the server validates fields, so `kubectl apply` needs no
`--validate=false`, and that custom resources take no strategic merge patch. Custom resources also
have their component schemas (the CRD version's openAPIV3Schema with the standard apiVersion, kind
and metadata, and the list type), with the meta.k8s.io types they refer to, for `kubectl explain`.
Built-in types have paths but no component schemas: kubectl then computes their patches from its
compiled-in types, as it would with a full document.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from functools import cache
from typing import Any

from prewarm_devtools.kubeapi.builtintypes import definitions
from prewarm_devtools.kubeapi.patch import CUSTOM_PATCH_TYPES, PATCH_TYPES
from prewarm_devtools.kubeapi.resources.types import ResourceType
from prewarm_devtools.kubeapi.store import dumps

Obj = dict[str, Any]

_META = "io.k8s.apimachinery.pkg.apis.meta.v1"
_CONVENTIONS = "https://git.k8s.io/community/contributors/devel/sig-architecture/api-conventions.md"
_API_VERSION: Obj = {
    "type": "string",
    "description": "APIVersion defines the versioned schema of this representation of an object. Servers should "
    "convert recognized schemas to the latest internal value, and may reject unrecognized values. More info: "
    f"{_CONVENTIONS}#resources",
}
_KIND: Obj = {
    "type": "string",
    "description": "Kind is a string value representing the REST resource this object represents. Servers may "
    "infer this from the endpoint the client submits requests to. Cannot be updated. In CamelCase. More info: "
    f"{_CONVENTIONS}#types-kinds",
}
_STRING: Obj = {"type": "string"}


def _ref(name: str) -> Obj:
    return {"$ref": f"#/components/schemas/{name}"}


def _described_ref(name: str, description: str) -> Obj:
    return {"allOf": [_ref(name)], "description": description}


#: The meta.k8s.io/v1 types that custom resource schemas and operations refer to.
_META_TYPES = ("Time", "FieldsV1", "OwnerReference", "ManagedFieldsEntry", "ObjectMeta", "ListMeta", "StatusCause",
               "StatusDetails", "Status", "Preconditions", "DeleteOptions", "Patch")


@cache
def meta_schemas() -> dict[str, Obj]:
    """The meta.k8s.io/v1 types as kubernetes-validate's schemas have them, as OpenAPI 3.0 components."""
    return {f"{_META}.{name}": _component(definitions()[f"{_META}.{name}"]) for name in _META_TYPES}


def _component(schema: Any) -> Any:
    """A JSON schema of kubernetes-validate's as the API server's OpenAPI 3.0 has it: references to
    components, a type without null, objects not closed (the strict schemas close them)."""
    if isinstance(schema, list):
        return [_component(item) for item in schema]
    if not isinstance(schema, dict):
        return schema
    converted = {}
    for key, value in schema.items():
        if key == "$ref":
            converted[key] = "#/components/schemas/" + value.rsplit("/", 1)[1]
        elif key == "type" and isinstance(value, list):
            converted[key] = next(t for t in value if t != "null")
        elif key != "additionalProperties" or value is not False:
            converted[key] = _component(value)
    return converted


def _query(name: str, kind: str = "string", description: str = "") -> Obj:
    parameter: Obj = {"name": name, "in": "query", "schema": {"type": kind, "uniqueItems": True}}
    if description:
        parameter["description"] = description
    return parameter


def _path_parameter(name: str, description: str) -> Obj:
    return {
        "name": name,
        "in": "path",
        "description": description,
        "required": True,
        "schema": {"type": "string", "uniqueItems": True},
    }


_PRETTY = _query("pretty", description="If 'true', then the output is pretty printed.")
_FIELD_VALIDATION = _query(
    "fieldValidation",
    description="fieldValidation instructs the server on how to handle objects in the request (POST/PUT/PATCH) "
    "containing unknown or duplicate fields. Valid values are: - Ignore - Warn (the default) - Strict",
)
_WRITE = [_query("dryRun"), _query("fieldManager"), _FIELD_VALIDATION]
_LIST = [
    _query(name) for name in ("continue", "fieldSelector", "labelSelector", "resourceVersion", "resourceVersionMatch")
] + [
    _query("allowWatchBookmarks", "boolean"),
    _query("limit", "integer"),
    _query("sendInitialEvents", "boolean"),
    _query("timeoutSeconds", "integer"),
    _query("watch", "boolean"),
]
_DELETE = [
    _query("dryRun"),
    _query("gracePeriodSeconds", "integer"),
    _query("orphanDependents", "boolean"),
    _query("propagationPolicy"),
]


_OPERATION_VERBS = {
    "list": "list",
    "post": "create",
    "deletecollection": "deletecollection",
    "get": "read",
    "put": "replace",
    "delete": "delete",
    "patch": "patch",
}


def model_name(group: str, version: str, kind: str) -> str:
    """A custom resource's component schema name: the group reversed (`dev.prewarm.v1alpha1.ImagePullJob`)."""
    return ".".join([*reversed(group.split(".")), version, kind])


def _content(schema: Obj | None, types: tuple[str, ...] = ("application/json", "application/yaml")) -> Obj:
    return {media: ({"schema": schema} if schema is not None else {}) for media in types}


class _Paths:
    """The operations of one group version's resources, as the API installer describes them."""

    def __init__(self, base: str) -> None:
        self.base = base
        self.paths: dict[str, Obj] = {}

    def add(
        self,
        rtype: ResourceType,
        suffix: str,
        method: str,
        action: str,
        returns: Obj | None,
        body: Obj | None = None,
        parameters: tuple[Obj, ...] = (),
        everywhere: bool = False,
    ) -> None:
        """One operation; `everywhere`: the list across namespaces of a namespaced resource."""
        scope = "namespaces/{namespace}/" if rtype.namespaced and not everywhere else ""
        path = f"{self.base}/{scope}{rtype.name}{suffix}"
        entry = self.paths.setdefault(path, {"parameters": self._path_parameters(rtype, path)})
        gvk = {"group": rtype.group, "version": rtype.version, "kind": rtype.kind}
        verb = _OPERATION_VERBS[action]
        subresource = "Status" if suffix.endswith("/status") else ""
        operation: Obj = {
            "description": f"{verb} {rtype.kind}",
            "operationId": f"{verb}{'Namespaced' if scope else ''}{rtype.kind}{subresource}"
            + ("ForAllNamespaces" if everywhere else ""),
            "parameters": list(parameters),
            "responses": {
                "200": {"description": "OK", "content": _content(returns)},
                "401": {"description": "Unauthorized"},
            },
            "x-kubernetes-action": action,
            "x-kubernetes-group-version-kind": gvk,
        }
        if body is not None:
            operation["requestBody"] = {"content": body, "required": True}
        entry[method] = operation

    @staticmethod
    def _path_parameters(rtype: ResourceType, path: str) -> list[Obj]:
        parameters = []
        if "{name}" in path:
            parameters.append(_path_parameter("name", f"name of the {rtype.kind}"))
        if "{namespace}" in path:
            parameters.append(
                _path_parameter("namespace", "object name and auth scope, such as for teams and projects")
            )
        return [*parameters, _PRETTY]


def _add_resource(paths: _Paths, rtype: ResourceType, schema: Obj | None, list_schema: Obj | None) -> None:
    verbs = set(rtype.verbs)
    status = _ref(f"{_META}.Status")
    patch_types = CUSTOM_PATCH_TYPES if rtype.custom is not None else (*PATCH_TYPES, "application/apply-patch+yaml")
    if "list" in verbs:
        paths.add(rtype, "", "get", "list", list_schema, parameters=tuple(_LIST))
        if rtype.namespaced:
            paths.add(rtype, "", "get", "list", list_schema, parameters=tuple(_LIST), everywhere=True)
    if "create" in verbs:
        paths.add(rtype, "", "post", "post", schema, _content(schema), tuple(_WRITE))
    if "deletecollection" in verbs:
        paths.add(rtype, "", "delete", "deletecollection", status, parameters=tuple(_DELETE + _LIST))
    item = "/{name}"
    if "get" in verbs:
        paths.add(rtype, item, "get", "get", schema, parameters=(_query("resourceVersion"),))
    if "update" in verbs:
        paths.add(rtype, item, "put", "put", schema, _content(schema), tuple(_WRITE))
    if "patch" in verbs:
        paths.add(
            rtype,
            item,
            "patch",
            "patch",
            schema,
            _content(_ref(f"{_META}.Patch"), patch_types),
            (*_WRITE, _query("force", "boolean")),
        )
    if "delete" in verbs:
        paths.add(rtype, item, "delete", "delete", schema, _content(_ref(f"{_META}.DeleteOptions")), tuple(_DELETE))
    if rtype.has_status:
        paths.add(rtype, item + "/status", "get", "get", schema, parameters=(_query("resourceVersion"),))
        paths.add(rtype, item + "/status", "put", "put", schema, _content(schema), tuple(_WRITE))
        paths.add(
            rtype,
            item + "/status",
            "patch",
            "patch",
            schema,
            _content(_ref(f"{_META}.Patch"), patch_types),
            (*_WRITE, _query("force", "boolean")),
        )


def _custom_schemas(rtype: ResourceType) -> dict[str, Obj]:
    """A custom resource's schema and list schema, as the CRD OpenAPI builder makes them."""
    assert rtype.custom is not None
    gvk = {"group": rtype.group, "version": rtype.version, "kind": rtype.kind}
    name = model_name(rtype.group, rtype.version, rtype.kind)
    schema = dict(rtype.custom.schema or {"type": "object"})
    schema["properties"] = {
        **(schema.get("properties") or {}),
        "apiVersion": _API_VERSION,
        "kind": _KIND,
        "metadata": _described_ref(
            f"{_META}.ObjectMeta", f"Standard object's metadata. More info: {_CONVENTIONS}#metadata"
        ),
    }
    schema["x-kubernetes-group-version-kind"] = [gvk]
    listed = {
        "type": "object",
        "description": f"{rtype.list_kind} is a list of {rtype.kind}",
        "required": ["items"],
        "properties": {
            "apiVersion": _API_VERSION,
            "items": {
                "type": "array",
                "description": f"List of {rtype.name}. More info: {_CONVENTIONS}",
                "items": _ref(name),
            },
            "kind": _KIND,
            "metadata": _described_ref(
                f"{_META}.ListMeta", f"Standard list metadata. More info: {_CONVENTIONS}#types-kinds"
            ),
        },
        "x-kubernetes-group-version-kind": [{**gvk, "kind": rtype.list_kind}],
    }
    return {name: schema, model_name(rtype.group, rtype.version, rtype.list_kind): listed}


def document(group_version: str, served: Mapping[str, ResourceType], version: str) -> Obj:
    """The OpenAPI v3 document of one group version (`version`: the server's, for the title)."""
    paths = _Paths("/api/v1" if group_version == "v1" else f"/apis/{group_version}")
    schemas: dict[str, Obj] = {}
    custom = any(r.custom is not None for r in served.values())
    for rtype in sorted(served.values(), key=lambda r: r.name):
        own: dict[str, Obj] = _custom_schemas(rtype) if rtype.custom is not None else {}
        names = list(own)
        schemas.update(own)
        _add_resource(paths, rtype, _ref(names[0]) if own else None, _ref(names[1]) if own else None)
    if custom:
        schemas.update(meta_schemas())
    title, info_version = ("Kubernetes CRD Swagger", "v0.1.0") if custom else ("Kubernetes", version)
    return {
        "openapi": "3.0.0",
        "info": {"title": title, "version": info_version},
        "paths": paths.paths,
        "components": {
            "schemas": dict(sorted(schemas.items())),
            "securitySchemes": {
                "BearerToken": {
                    "type": "apiKey",
                    "description": "Bearer Token authentication",
                    "name": "authorization",
                    "in": "header",
                }
            },
        },
    }


def path_of(group_version: str) -> str:
    """Where a group version's document is under /openapi/v3: `api/v1`, `apis/<group>/<version>`."""
    return "api/v1" if group_version == "v1" else f"apis/{group_version}"


def index(documents: Mapping[str, Obj]) -> Obj:
    """`/openapi/v3`: each document's path and URL, whose hash changes whenever the document does."""
    return {
        "paths": {
            path: {"serverRelativeURL": f"/openapi/v3/{path}?hash={hashlib.sha512(dumps(doc)).hexdigest().upper()}"}
            for path, doc in documents.items()
        }
    }


#: What clients ask /openapi/v2 for (the old name first), and what the answer says it is.
V2_PROTOBUF_ACCEPTED = (
    "application/com.github.proto-openapi.spec.v2@v1.0+protobuf",
    "application/com.github.proto-openapi.spec.v2.v1.0+protobuf",
)
V2_PROTOBUF = V2_PROTOBUF_ACCEPTED[1]


def _protobuf_field(number: int, payload: bytes) -> bytes:
    # A length-delimited field (wire type 2); every length here is below 128, one varint byte.
    return bytes([number << 3 | 2, len(payload)]) + payload


def v2_document(version: str, protobuf: bool) -> bytes:
    """`/openapi/v2` without paths or definitions: clients that validate against it (kubectl before
    1.27) find no schema for any kind and leave validation to the server, which kubectl 1.27 and
    later learn from `/openapi/v3` that it does."""
    if not protobuf:
        return dumps({"swagger": "2.0", "info": {"title": "Kubernetes", "version": version}, "paths": {}})
    info = _protobuf_field(1, b"Kubernetes") + _protobuf_field(2, version.encode())
    return _protobuf_field(1, b"2.0") + _protobuf_field(2, info) + _protobuf_field(8, b"")
