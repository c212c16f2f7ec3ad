"""API errors as the Kubernetes API server reports them: a `Status` object with reason and code.

Reasons, codes and message wording follow k8s.io/apimachinery/pkg/api/errors, so clients that
branch on `reason` or parse `message` behave here as they do against EKS.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class FieldError:
    """One validation failure of one field, rendered as `field.Error` renders it."""

    type: str  # Required, Invalid, TypeInvalid, Forbidden, TooLong, TooMany, NotSupported, Duplicate
    field: str
    value: Any = None
    detail: str = ""

    _CAUSES = {
        "Required": ("FieldValueRequired", "Required value"),
        "Invalid": ("FieldValueInvalid", "Invalid value"),
        "TypeInvalid": ("FieldValueTypeInvalid", "Invalid value"),
        "Forbidden": ("FieldValueForbidden", "Forbidden"),
        "TooLong": ("FieldValueTooLong", "Too long"),
        "TooMany": ("FieldValueTooMany", "Too many"),
        "NotSupported": ("FieldValueNotSupported", "Unsupported value"),
        "Duplicate": ("FieldValueDuplicate", "Duplicate value"),
    }

    @property
    def cause_reason(self) -> str:
        return self._CAUSES[self.type][0]

    def body(self) -> str:
        """The message without the field path, e.g. `Invalid value: "x": must be ...`."""
        text = self._CAUSES[self.type][1]
        if self.type in ("Invalid", "TypeInvalid", "NotSupported", "Duplicate", "TooMany"):
            text += f": {render_value(self.value)}"
        if self.detail:
            text += f": {self.detail}"
        return text

    def __str__(self) -> str:
        return f"{self.field}: {self.body()}"


class GoSyntax(str):
    """A bad value already written as Go's `%#v` writes it, e.g. `map[string]string{"a":"b"}`."""


def render_value(value: Any) -> str:
    """A bad value as Go's `%#v`-like rendering in field errors shows it."""
    if isinstance(value, GoSyntax):
        return str(value)
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False)
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return str(value)
    if isinstance(value, list):
        return "[]string{" + ", ".join(render_value(v) for v in value) + "}"
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def aggregate(errors: list[FieldError]) -> str:
    """Several errors the way `ErrorList.ToAggregate()` prints them: repeats dropped, one bare, more in brackets."""
    messages = list(dict.fromkeys(str(e) for e in errors))
    if len(messages) == 1:
        return messages[0]
    return "[" + ", ".join(messages) + "]"


@dataclass
class StatusError(Exception):
    """An API request failed; `status()` is the `Status` body the server answers with."""

    code: int
    reason: str
    message: str
    details: dict[str, Any] | None = None
    continue_token: str | None = None
    headers: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        super().__init__(self.message)

    def status(self) -> dict[str, Any]:
        body: dict[str, Any] = {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {"continue": self.continue_token} if self.continue_token else {},
            "status": "Failure",
            "message": self.message,
            "code": self.code,
        }
        if self.reason:
            # An error the registry does not classify has reason "" (StatusReasonUnknown), omitted.
            body["reason"] = self.reason
        if self.details is not None:
            body["details"] = self.details
        return body


def _details(resource: str, name: str, group: str) -> dict[str, Any]:
    details: dict[str, Any] = {"name": name}
    if group:
        details["group"] = group
    details["kind"] = resource
    return details


def _qualified(resource: str, group: str) -> str:
    return f"{resource}.{group}" if group else resource


def not_found(resource: str, name: str, group: str = "") -> StatusError:
    return StatusError(
        404, "NotFound", f'{_qualified(resource, group)} "{name}" not found', _details(resource, name, group)
    )


def route_not_found() -> StatusError:
    return StatusError(404, "NotFound", "the server could not find the requested resource", {})


def already_exists(resource: str, name: str, group: str = "") -> StatusError:
    return StatusError(
        409, "AlreadyExists", f'{_qualified(resource, group)} "{name}" already exists', _details(resource, name, group)
    )


def conflict(resource: str, name: str, why: str, group: str = "") -> StatusError:
    return StatusError(
        409,
        "Conflict",
        f'Operation cannot be fulfilled on {_qualified(resource, group)} "{name}": {why}',
        _details(resource, name, group),
    )


STALE_OBJECT = "the object has been modified; please apply your changes to the latest version and try again"


def invalid(kind: str, name: str, errors: list[FieldError], group: str = "") -> StatusError:
    causes = [{"reason": e.cause_reason, "message": e.body(), "field": e.field} for e in errors]
    return StatusError(
        422,
        "Invalid",
        f'{_qualified(kind, group)} "{name}" is invalid: {aggregate(errors)}',
        {**_details(kind, name, group), "causes": causes},
    )


def bad_request(message: str) -> StatusError:
    return StatusError(400, "BadRequest", message)


def expired(message: str, continue_token: str | None = None) -> StatusError:
    return StatusError(410, "Expired", message, continue_token=continue_token)


def unauthorized() -> StatusError:
    return StatusError(401, "Unauthorized", "Unauthorized")


def forbidden(message: str, details: dict[str, Any] | None = None) -> StatusError:
    return StatusError(403, "Forbidden", message, details if details is not None else {})


def forbidden_resource(resource: str, name: str, group: str, why: str) -> StatusError:
    """`NewForbidden(groupResource, name, err)`: `<resource>[.<group>] ["<name>"] is forbidden: <why>`."""
    subject = _qualified(resource, group) + (f' "{name}"' if name else "")
    details = _details(resource, name, group)
    if not name:
        del details["name"]
    return forbidden(f"{subject} is forbidden: {why}", details)


def method_not_allowed() -> StatusError:
    return StatusError(405, "MethodNotAllowed", "the server does not allow this method on the requested resource", {})


def unsupported_media_type(content_type: str, accepted: list[str]) -> StatusError:
    return StatusError(
        415,
        "UnsupportedMediaType",
        f"the body of the request was in an unknown format - accepted media types include: {', '.join(accepted)}",
        {"causes": [{"reason": "UnexpectedServerResponse", "message": content_type}]},
    )


def internal_error(message: str) -> StatusError:
    return StatusError(
        500,
        "InternalError",
        f"Internal error occurred: {message}",
        {"causes": [{"message": message}]},
    )


def timeout(message: str) -> StatusError:
    return StatusError(504, "Timeout", message, {"retryAfterSeconds": 1})
