"""What a read's `Accept` header asks for: the object as stored, a `meta.k8s.io` Table (custom resources:
`table.py`), or the metadata alone, `PartialObjectMetadata` / `PartialObjectMetadataList`
(`Accept: application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1`).

As the API server negotiates (k8s.io/apiserver endpoints/handlers/negotiation and response.go,
`asPartialObjectMetadata(List)`; https://kubernetes.io/docs/reference/using-api/api-concepts/
"Metadata-only fetches"): the media ranges are tried by `q`, then in order; one whose `as`/`g`/`v` names
nothing this server can render is skipped; when none is left the answer is 406 NotAcceptable. A
range that names a real representation of the wrong shape (`PartialObjectMetadata` of a list, or
`PartialObjectMetadataList` of one object) is a 406 as well, without trying the next range.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from prewarm_devtools.kubeapi.errors import StatusError

META_GROUP = "meta.k8s.io"
# The API server renders these in meta.k8s.io/v1 and (deprecated) v1beta1.
META_VERSIONS = ("v1", "v1beta1")
PARTIAL = "PartialObjectMetadata"
PARTIAL_LIST = "PartialObjectMetadataList"
TABLE = "Table"
# The message of apiserver's NewNotAcceptableError for a built-in resource's serializers.
_ACCEPTED = "application/json, application/yaml, application/vnd.kubernetes.protobuf"
_JSON_RANGES = ("application/json", "application/*", "*/*")


@dataclass(frozen=True)
class Representation:
    """`kind` "" is the object as stored; else a meta.k8s.io kind in `version`."""

    kind: str = ""
    version: str = ""


AS_STORED = Representation()


def not_acceptable(message: str = f"only the following media types are accepted: {_ACCEPTED}") -> StatusError:
    return StatusError(406, "NotAcceptable", message, {})


def negotiate(accept: str) -> Representation:
    """The representation `accept` prefers among those this server renders; 406 when it names none.

    A range without `as` is the object as stored (protobuf and YAML ranges too: this server answers
    JSON, which every client here accepts). An empty header is the object as stored.
    """
    ranges = _ranges(accept)
    if not ranges:
        return AS_STORED
    for _, media_type, params in ranges:
        if "as" not in params:
            return AS_STORED
        kind, group, version = params["as"], params.get("g", ""), params.get("v", "")
        if media_type in _JSON_RANGES and group == META_GROUP and version in META_VERSIONS \
                and kind in (PARTIAL, PARTIAL_LIST, TABLE):
            return Representation(kind, version)
    raise not_acceptable()


def _ranges(accept: str) -> list[tuple[float, str, dict[str, str]]]:
    """The media ranges of `accept` with q > 0, best first (a stable sort: ties keep their order)."""
    found = []
    for position, media_range in enumerate(accept.split(",")):
        media_type, *parameters = (part.strip() for part in media_range.split(";"))
        if not media_type:
            continue
        params = {k.strip(): v.strip() for k, _, v in (p.partition("=") for p in parameters)}
        try:
            q = float(params.pop("q", "1"))
        except ValueError:
            q = 1.0
        if q > 0:
            found.append((-q, position, media_type.lower(), params))
    found.sort(key=lambda r: (r[0], r[1]))
    return [(-q, media_type, params) for q, _, media_type, params in found]


def as_partial_metadata(body: dict[str, Any], wanted: Representation, *, is_list: bool) -> dict[str, Any]:
    """The metadata of `body` (an object, or a list and its items) as `wanted` asks for it."""
    api_version = f"{META_GROUP}/{wanted.version}"
    if wanted.kind == PARTIAL:
        if is_list:
            raise not_acceptable(f"you requested {PARTIAL}, but the requested object is a list "
                                 f"(*v1.{body.get('kind', 'List')})")
        return {"kind": PARTIAL, "apiVersion": api_version, "metadata": body.get("metadata") or {}}
    if not is_list:
        raise not_acceptable(f"you requested {PARTIAL_LIST}, but the requested object is not a list "
                             f"(*v1.{body.get('kind', 'Object')})")
    items = [{"kind": PARTIAL, "apiVersion": api_version, "metadata": item.get("metadata") or {}}
             for item in body.get("items") or ()]
    return {"kind": PARTIAL_LIST, "apiVersion": api_version, "metadata": body.get("metadata") or {}, "items": items}
