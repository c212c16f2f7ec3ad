"""What a custom resource's schema asks beyond kube-openapi's keywords, as apiextensions-apiserver checks it.

- `list_type_errors`: `x-kubernetes-list-type: set` lists hold no value twice, `map` lists no two items
  with the same keys (structurallisttype.ValidateListSetsAndMaps): `spec.x[2]: Duplicate value: "a"`.
- `rule_errors`: the `x-kubernetes-validations` CEL rules (pkg/apiserver/schema/cel/validation.go,
  `validateExpressions`): `self` is the value at the rule's place, `oldSelf` the stored one on update;
  a rule that reads `oldSelf` (a transition rule) runs only when there is an old value to compare with:
  an update, and a place that correlates (object fields by name, `map` list items by their keys, never
  the items of other lists). A false rule yields `message`, or `messageExpression`'s value, or
  `failed rule: <rule>`, at the rule's place or its `fieldPath`, as the error its `reason` names
  (Invalid by default). As in Kubernetes 1.33 (the version the embedded API reports), the error's value
  is the schema type at the rule's place: `spec.selector: Invalid value: "object": <message>` (1.35
  shows a scalar's value instead and leaves out an object's: kubernetes/kubernetes#132798, #133832).
  A rule that does not evaluate yields `<error> evaluating rule: <rule>`. Rules are not run on null
  values.

Not done: validation ratcheting, cost estimation and runtime cost budgets, `optionalOldSelf`, and
rules inside `allOf`/`anyOf`/`oneOf`/`not`.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Any

from prewarm_devtools.kubeapi.cel import CelFailure, CelPrograms
from prewarm_devtools.kubeapi.errors import FieldError
from prewarm_devtools.kubeapi.goformat import go_value
from prewarm_devtools.kubeapi.schema import anywhere, field_schema, items_schema

Obj = dict[str, Any]

RULES = "x-kubernetes-validations"
_PROGRAMS = CelPrograms()
_OLD_SELF = re.compile(r"\boldSelf\b")
# `reason` of a rule and the field error it makes (fieldErrorForReason).
_REASONS = {
    "FieldValueInvalid": "Invalid",
    "FieldValueForbidden": "Forbidden",
    "FieldValueRequired": "Required",
    "FieldValueDuplicate": "Duplicate",
}
#: What the API server adds instead of running rules on an object with type, enum, size or required errors
#: (hasBlockingErr in the custom resource strategy): printed as `<nil>: Invalid value: "null": ...`.
NOT_CHECKED = FieldError(
    "Invalid",
    "<nil>",
    "null",
    "some validation rules were not checked because the object was invalid; correct the existing errors to "
    "complete validation",
)
_BLOCKING = frozenset({"NotSupported", "Required", "TooLong", "TooMany", "TypeInvalid"})


def blocks_rules(errors: list[FieldError]) -> bool:
    """Whether schema errors keep the rules from running (hasBlockingErr)."""
    return any(error.type in _BLOCKING for error in errors)


def _child(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


# -- list types --------------------------------------------------------------------------------------


def list_type_errors(value: Any, schema: Obj | None, path: str = "") -> list[FieldError]:
    """Duplicates in `set` and `map` lists, anywhere in `value`."""
    return list(_list_types(value, schema, path)) if schema else []


def _list_types(value: Any, schema: Obj, path: str) -> Iterator[FieldError]:
    if isinstance(value, list):
        kind = schema.get("x-kubernetes-list-type")
        keys = list(schema.get("x-kubernetes-list-map-keys") or [])
        seen: set[str] = set()
        for i, item in enumerate(value):
            if kind == "set":
                identity = json.dumps(item, sort_keys=True)
                if identity in seen:
                    yield FieldError("Duplicate", f"{path}[{i}]", go_value(item))
                seen.add(identity)
            elif kind == "map" and isinstance(item, dict):
                identity = json.dumps([item.get(k) for k in keys])
                if identity in seen:
                    shown = "{" + ", ".join(f'"{k}":{json.dumps(item.get(k))}' for k in keys if k in item) + "}"
                    yield FieldError("Duplicate", f"{path}[{i}]", go_value(shown))
                seen.add(identity)
        items = items_schema(schema)
        if items is not None:
            for i, item in enumerate(value):
                yield from _list_types(item, items, f"{path}[{i}]")
    elif isinstance(value, dict):
        for key, item in value.items():
            if (nested := field_schema(schema, key)) is not None:
                yield from _list_types(item, nested, _child(path, key))


# -- CEL rules ---------------------------------------------------------------------------------------


def has_rules(schema: Obj | None) -> bool:
    """Whether any place of `schema` has `x-kubernetes-validations`."""
    return anywhere(schema, lambda s: bool(s.get(RULES)))


def rule_errors(value: Any, old: Any, schema: Obj | None, path: str = "") -> list[FieldError]:
    """The failed `x-kubernetes-validations` of `value` (`old`: the stored value, None on create)."""
    return list(_rules(value, old, schema, path)) if schema else []


def _rules(value: Any, old: Any, schema: Obj, path: str) -> Iterator[FieldError]:
    if value is None:
        return
    for rule in schema.get(RULES) or []:
        yield from _run(rule, value, old, schema, path)
    if isinstance(value, dict):
        old_map = old if isinstance(old, dict) else {}
        for key, item in value.items():
            if (nested := field_schema(schema, key)) is not None:
                yield from _rules(item, old_map.get(key), nested, _child(path, key))
    elif isinstance(value, list):
        items = items_schema(schema)
        if items is None:
            return
        for i, item in enumerate(value):
            yield from _rules(item, _correlated(item, old, schema), items, f"{path}[{i}]")


def _correlated(item: Any, old: Any, schema: Obj) -> Any:
    """The old item a list item is compared with: only `map` lists correlate, by their keys."""
    keys = schema.get("x-kubernetes-list-map-keys") or []
    if schema.get("x-kubernetes-list-type") != "map" or not keys or not isinstance(old, list):
        return None
    if not isinstance(item, dict):
        return None
    return next((o for o in old if isinstance(o, dict) and all(o.get(k) == item.get(k) for k in keys)), None)


def _rule_text(rule: Obj) -> str:
    """ruleErrorString: the message when there is one, else the rule."""
    return str(rule.get("message") or "").strip() or str(rule.get("rule") or "").strip()


def _field_path(path: str, field_path: str) -> str:
    """The rule's place joined with its `fieldPath` (`.a.b` or `['a']`)."""
    for name, quoted in re.findall(r"\.([^.\[\]]+)|\['((?:[^'\\]|\\.)*)'\]", field_path):
        path = _child(path, name) if name else f"{path}[{quoted}]"
    return path


def _run(rule: Obj, value: Any, old: Any, schema: Obj, path: str) -> Iterator[FieldError]:
    expression = str(rule.get("rule") or "")
    if not expression:
        return
    transition = bool(_OLD_SELF.search(expression))
    if transition and old is None:
        return
    kind = str(schema.get("type") or "")
    activation: Obj = {"self": value}
    if transition:
        activation["oldSelf"] = old
    try:
        result = _PROGRAMS.evaluate(expression, activation)
    except CelFailure as e:
        if str(e).startswith("no such overload"):
            # int-or-string values skip type checking, so a wrong overload shows only now.
            detail = (f"'{e}': call arguments did not match a supported operator, function or macro signature for "
                      f"rule: {_rule_text(rule)}")
        else:
            detail = f"{e} evaluating rule: {_rule_text(rule)}"
        yield FieldError("Invalid", path, kind, detail)
        return
    if bool(result):
        return
    detail = ""
    if rule.get("messageExpression"):
        try:
            detail = str(_PROGRAMS.evaluate(str(rule["messageExpression"]), activation)).strip()
        except CelFailure:
            detail = ""  # the API server logs it and falls back to the message
    if not detail:
        message = str(rule.get("message") or "").strip()
        detail = message or f"failed rule: {_rule_text(rule)}"
    where = _field_path(path, str(rule.get("fieldPath") or ""))
    error_type = _REASONS.get(str(rule.get("reason") or "FieldValueInvalid"), "Invalid")
    if error_type in ("Forbidden", "Required"):
        yield FieldError(error_type, where, detail=detail)
    elif error_type == "Duplicate":
        yield FieldError("Duplicate", where, kind)
    else:
        yield FieldError("Invalid", where, kind, detail)
