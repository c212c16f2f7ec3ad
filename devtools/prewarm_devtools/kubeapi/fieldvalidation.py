"""Decoding a write's body as the type's codec does, and what `fieldValidation` makes of unknown fields:
dropped with a warning (`Warn`, the default), silently (`Ignore`) or refused (`Strict`, kubectl's
default). Built-in kinds are decoded into their Go types first (builtindecoding.py): a value of the wrong
type is 400 with Go's error on a create or update, 422 naming the patch on a patch."""

from __future__ import annotations

from typing import Any

from prewarm_devtools.kubeapi import errors
from prewarm_devtools.kubeapi.builtindecoding import Decoded, GoDecodeError, decode_json, decode_unstructured, go_format
from prewarm_devtools.kubeapi.builtintypes import kind_type
from prewarm_devtools.kubeapi.errors import FieldError, StatusError
from prewarm_devtools.kubeapi.goformat import go_json
from prewarm_devtools.kubeapi.patch import STRATEGIC_MERGE_PATCH
from prewarm_devtools.kubeapi.resources.types import ResourceType

Obj = dict[str, Any]


FIELD_VALIDATIONS = ("Ignore", "Strict", "Warn")


def decode_object(
    rtype: ResourceType,
    obj: Obj,
    field_validation: str = "Warn",
    warnings: list[str] | None = None,
    patching: bool = False,
) -> None:
    """Decode `obj` as the type's codec does: unknown fields dropped with a warning (`Warn`), silently
    (`Ignore`) or refused (`Strict`), as fieldValidation asks."""
    unknown = rtype.decode(obj)
    if not unknown or field_validation == "Ignore":
        return
    problems = [f'unknown field "{path}"' for path in unknown]
    if field_validation != "Strict":
        if warnings is not None:
            warnings.extend(problems)
        return
    strict = "strict decoding error: " + ", ".join(problems)
    if patching:
        raise errors.bad_request(strict)
    raise errors.bad_request(
        f'{rtype.kind} in version "{rtype.version}" cannot be handled as a {rtype.kind}: {strict}'
    )


def decode_typed(rtype: ResourceType, obj: Obj, field_validation: str, warnings: list[str] | None) -> None:
    """Decode a create or update body of a built-in kind into its Go type: a value of the wrong type is
    400 with Go's error, unknown fields are dropped, warned of or refused as fieldValidation asks."""
    go_type = kind_type(rtype.api_version, rtype.kind)
    if go_type is None:
        return
    undecodable = f'{rtype.kind} in version "{rtype.version}" cannot be handled as a {rtype.kind}: '
    try:
        decoded = decode_json(go_type, obj)
    except GoDecodeError as e:
        raise errors.bad_request(undecodable + str(e)) from None
    if decoded.strict and field_validation == "Strict":
        raise errors.bad_request(undecodable + "strict decoding error: " + ", ".join(decoded.strict))
    if field_validation == "Warn" and warnings is not None:
        warnings.extend(decoded.strict)
    decoded.drop_unknown()


def decode_patched(
    rtype: ResourceType, content_type: str, patch: Any, patched: Obj, field_validation: str,
    warnings: list[str] | None,
) -> None:
    """Decode a patched built-in object as the patch handler does: a strategic merge patch's result
    through the unstructured converter, a merge or JSON patch's as JSON; what fails is 422 naming the
    patch (the patch, or the patched object, as Go prints it)."""
    go_type = kind_type(rtype.api_version, rtype.kind)
    if go_type is None:
        return
    strategic = content_type == STRATEGIC_MERGE_PATCH

    def invalid(detail: str) -> StatusError:
        shown = go_format(patch) if strategic else go_json(patched)
        problem = FieldError("Invalid", "patch", shown, detail)
        causes = [{"reason": problem.cause_reason, "message": problem.body(), "field": problem.field}]
        return StatusError(422, "Invalid", f' "" is invalid: {problem}', {"causes": causes})

    try:
        decoded: Decoded = (decode_unstructured if strategic else decode_json)(go_type, patched)
    except GoDecodeError as e:
        raise invalid(str(e)) from None
    if decoded.strict and field_validation == "Strict":
        raise invalid("strict decoding error: " + ", ".join(decoded.strict))
    if field_validation == "Warn" and warnings is not None:
        warnings.extend(decoded.strict)
    decoded.drop_unknown()
