"""Just enough of the Kubernetes protobuf encoding to read access reviews as kubectl sends them.

kubectl's typed clients send built-in types as `application/vnd.kubernetes.protobuf`: the bytes
`k8s\\x00`, then a `runtime.Unknown` (typeMeta, raw) whose `raw` is the object's message. Only
`SelfSubjectAccessReview` and `SubjectAccessReview` are decoded (into their JSON form); the
answer goes back as JSON, which kubectl accepts too.
"""

from __future__ import annotations

from typing import Any

__all__ = ["PROTOBUF", "ProtobufError", "decode_review"]

PROTOBUF = "application/vnd.kubernetes.protobuf"
_MAGIC = b"k8s\x00"


class ProtobufError(ValueError):
    """The body is not a protobuf access review this server can read."""


def _varint(data: bytes, at: int) -> tuple[int, int]:
    value, shift = 0, 0
    while True:
        if at >= len(data) or shift > 63:
            raise ProtobufError("truncated varint")
        byte = data[at]
        at += 1
        value |= (byte & 0x7F) << shift
        shift += 7
        if not byte & 0x80:
            return value, at


def _fields(data: bytes) -> dict[int, list[bytes | int]]:
    """Field number → values (bytes for length-delimited fields, int for varints)."""
    fields: dict[int, list[bytes | int]] = {}
    at = 0
    while at < len(data):
        key, at = _varint(data, at)
        number, wire = key >> 3, key & 7
        value: bytes | int
        if wire == 0:
            value, at = _varint(data, at)
        elif wire == 2:
            size, at = _varint(data, at)
            if at + size > len(data):
                raise ProtobufError("truncated field")
            value, at = data[at : at + size], at + size
        elif wire == 1:
            value, at = int.from_bytes(data[at : at + 8], "little"), at + 8
        elif wire == 5:
            value, at = int.from_bytes(data[at : at + 4], "little"), at + 4
        else:
            raise ProtobufError(f"unsupported wire type {wire}")
        fields.setdefault(number, []).append(value)
    return fields


def _message(fields: dict[int, list[bytes | int]], number: int) -> dict[int, list[bytes | int]] | None:
    values = fields.get(number)
    if not values or not isinstance(values[-1], bytes):
        return None
    return _fields(values[-1])


def _text(fields: dict[int, list[bytes | int]], number: int) -> str:
    values = fields.get(number) or []
    return values[-1].decode() if values and isinstance(values[-1], bytes) else ""


def _texts(fields: dict[int, list[bytes | int]], number: int) -> list[str]:
    return [v.decode() for v in fields.get(number) or [] if isinstance(v, bytes)]


_RESOURCE_ATTRIBUTES = ("namespace", "verb", "group", "version", "resource", "subresource", "name")


def decode_review(body: bytes) -> dict[str, Any]:
    """A protobuf `SelfSubjectAccessReview` or `SubjectAccessReview` as its JSON object."""
    if not body.startswith(_MAGIC):
        raise ProtobufError("no k8s protobuf envelope")
    unknown = _fields(body[len(_MAGIC) :])
    type_meta = _message(unknown, 1) or {}
    raw = (unknown.get(2) or [b""])[-1]
    if not isinstance(raw, bytes):
        raise ProtobufError("no raw object")
    review = _fields(raw)
    spec_fields = _message(review, 2) or {}
    spec: dict[str, Any] = {}
    resource = _message(spec_fields, 1)
    if resource is not None:
        spec["resourceAttributes"] = {
            key: _text(resource, i + 1) for i, key in enumerate(_RESOURCE_ATTRIBUTES) if _text(resource, i + 1)
        }
    non_resource = _message(spec_fields, 2)
    if non_resource is not None:
        spec["nonResourceAttributes"] = {
            key: _text(non_resource, i + 1) for i, key in enumerate(("path", "verb")) if _text(non_resource, i + 1)
        }
    # SubjectAccessReviewSpec: user 3, groups 4, extra 5, uid 6.
    if _text(spec_fields, 3):
        spec["user"] = _text(spec_fields, 3)
    if _texts(spec_fields, 4):
        spec["groups"] = _texts(spec_fields, 4)
    if _text(spec_fields, 6):
        spec["uid"] = _text(spec_fields, 6)
    return {"kind": _text(type_meta, 2), "apiVersion": _text(type_meta, 1), "metadata": {}, "spec": spec}
