"""DaemonSets (apps/v1): defaulting, the generation and template generation, and validation of the
selector, the pod template and the update strategy, with bad values rendered as Go prints them."""

from __future__ import annotations

import json
import re
from typing import Any

from prewarm_devtools.kubeapi.errors import FieldError, GoSyntax
from prewarm_devtools.kubeapi.resources.pods import POD_MERGE_LISTS, default_pod_spec, pod_spec_errors
from prewarm_devtools.kubeapi.resources.types import (
    COMMON_MERGE_LISTS,
    NAME_FIELDS,
    Obj,
    ResourceType,
    object_at,
    supported,
    undecodable,
)
from prewarm_devtools.kubeapi.selectors import Requirement
from prewarm_devtools.kubeapi.validation import label_value_errors, qualified_name_errors

APPS_GROUP = "apps"

# -- Go renderings of bad values, where field errors print them with %#v ---------------------------


def _go_quote(value: Any) -> str:
    return json.dumps(str(value), ensure_ascii=False)


def _go_strings(values: Any) -> str:
    if values is None:
        return "[]string(nil)"
    return "[]string{" + ", ".join(_go_quote(v) for v in values) + "}"


def _go_string_map(value: Any) -> GoSyntax:
    if value is None:
        return GoSyntax("map[string]string(nil)")
    items = sorted(value.items()) if isinstance(value, dict) else []
    return GoSyntax("map[string]string{" + ", ".join(f"{_go_quote(k)}:{_go_quote(v)}" for k, v in items) + "}")


def _go_label_selector(selector: Any) -> Any:
    if not isinstance(selector, dict):
        return "null"
    expressions = selector.get("matchExpressions")
    if expressions is None:
        rendered = "[]v1.LabelSelectorRequirement(nil)"
    else:
        rendered = (
            "[]v1.LabelSelectorRequirement{"
            + ", ".join(
                f"v1.LabelSelectorRequirement{{Key:{_go_quote(e.get('key', ''))}, "
                f"Operator:{_go_quote(e.get('operator', ''))}, Values:{_go_strings(e.get('values'))}}}"
                for e in expressions
                if isinstance(e, dict)
            )
            + "}"
        )
    return GoSyntax(
        f"v1.LabelSelector{{MatchLabels:{_go_string_map(selector.get('matchLabels'))}, MatchExpressions:{rendered}}}"
    )


def _go_int_or_string(value: Any) -> GoSyntax:
    if isinstance(value, str):
        return GoSyntax(f"intstr.IntOrString{{Type:1, IntVal:0, StrVal:{_go_quote(value)}}}")
    return GoSyntax(f'intstr.IntOrString{{Type:0, IntVal:{value}, StrVal:""}}')


# -- DaemonSets ------------------------------------------------------------------------------------

_TEMPLATE_GENERATION = "deprecated.daemonset.template.generation"
# DaemonSetStatus fields without omitempty: a stored status always has them.
_DAEMON_SET_COUNTS = ("currentNumberScheduled", "numberMisscheduled", "desiredNumberScheduled", "numberReady")
_SELECTOR_OPERATORS = {"In": "in", "NotIn": "notin", "Exists": "exists", "DoesNotExist": "!"}
_PERCENT_MSG = (
    "a valid percent string must be a numeric string followed by an ending '%' (e.g. '1%',  or '93%', "
    "regex used for validation is '[0-9]+%')"
)


def _template_generation(obj: Obj) -> int:
    """The annotation that apps/v1 carries the internal spec.templateGeneration in (0 when absent)."""
    annotations = (obj.get("metadata") or {}).get("annotations")
    value = annotations.get(_TEMPLATE_GENERATION) if isinstance(annotations, dict) else None
    if value is None:
        return 0
    if not re.fullmatch("[+-]?[0-9]+", str(value)):
        raise undecodable("DaemonSet", f"strconv.ParseInt: parsing {_go_quote(value)}: invalid syntax")
    return int(value)


def _set_template_generation(obj: Obj, generation: int) -> None:
    metadata = obj["metadata"]
    annotations = metadata.get("annotations")
    if annotations is None:
        annotations = metadata["annotations"] = {}
    if isinstance(annotations, dict):
        annotations[_TEMPLATE_GENERATION] = str(generation)


def _default_daemon_set(obj: Obj) -> None:
    spec = object_at(obj, "spec", "DaemonSet")
    strategy = object_at(spec, "updateStrategy", "DaemonSet")
    if not strategy.get("type"):
        strategy["type"] = "RollingUpdate"
    if strategy["type"] == "RollingUpdate":
        rolling = object_at(strategy, "rollingUpdate", "DaemonSet")
        for key, default in (("maxUnavailable", 1), ("maxSurge", 0)):
            if rolling.get(key) is None:
                rolling[key] = default
    if spec.get("revisionHistoryLimit") is None:
        spec["revisionHistoryLimit"] = 10
    template = object_at(spec, "template", "DaemonSet")
    default_pod_spec(object_at(template, "spec", "DaemonSet"))
    status = obj.get("status")
    if isinstance(status, dict):
        for key in _DAEMON_SET_COUNTS:
            status.setdefault(key, 0)
    _template_generation(obj)


def _prepare_daemon_set_create(obj: Obj) -> None:
    obj["status"] = dict.fromkeys(_DAEMON_SET_COUNTS, 0)
    obj["metadata"]["generation"] = 1
    _set_template_generation(obj, max(1, _template_generation(obj)))


def _prepare_daemon_set_update(obj: Obj, old: Obj) -> None:
    # The registry has already carried the old generation over; only spec changes move it.
    spec, old_spec = obj.get("spec") or {}, old.get("spec") or {}
    generation = int(old["metadata"].get("generation") or 0)
    template_generation = _template_generation(old)
    if spec.get("template") != old_spec.get("template"):
        generation, template_generation = generation + 1, template_generation + 1
    elif spec != old_spec:
        generation += 1
    if generation:
        obj["metadata"]["generation"] = generation
    _set_template_generation(obj, template_generation)


def selector_requirements(selector: Obj) -> list[Requirement] | None:
    """LabelSelectorAsSelector of a non-nil selector, or None where it fails (validation says why)."""
    match_labels = selector.get("matchLabels") or {}
    if not isinstance(match_labels, dict):
        return None
    requirements = [Requirement(str(k), "=", (str(v),)) for k, v in match_labels.items()]
    for expression in selector.get("matchExpressions") or []:
        operator = _SELECTOR_OPERATORS.get(str(expression.get("operator"))) if isinstance(expression, dict) else None
        if operator is None:
            return None
        values = tuple(str(v) for v in expression.get("values") or [])
        requirements.append(Requirement(str(expression.get("key") or ""), operator, values))
    return requirements


def _label_selector_errors(selector: Any, path: str) -> list[FieldError]:
    """ValidateLabelSelector: label keys and values, and each expression's operator and values."""
    if not isinstance(selector, dict):
        return []
    errors: list[FieldError] = []
    match_labels = selector.get("matchLabels") or {}
    for key, value in match_labels.items() if isinstance(match_labels, dict) else ():
        errors += [FieldError("Invalid", f"{path}.matchLabels", key, m) for m in qualified_name_errors(str(key))]
        errors += [FieldError("Invalid", f"{path}.matchLabels", value, m) for m in label_value_errors(str(value))]
    for i, expression in enumerate(selector.get("matchExpressions") or []):
        where = f"{path}.matchExpressions[{i}]"
        if not isinstance(expression, dict):
            errors.append(FieldError("Invalid", where, expression, "must be an object"))
            continue
        operator, values = expression.get("operator"), expression.get("values") or []
        if operator in ("In", "NotIn"):
            if not values:
                detail = "must be specified when `operator` is 'In' or 'NotIn'"
                errors.append(FieldError("Required", f"{where}.values", detail=detail))
        elif operator in ("Exists", "DoesNotExist"):
            if values:
                detail = "may not be specified when `operator` is 'Exists' or 'DoesNotExist'"
                errors.append(FieldError("Forbidden", f"{where}.values", detail=detail))
        else:
            errors.append(FieldError("Invalid", f"{where}.operator", operator, "not a valid selector operator"))
        key = str(expression.get("key") or "")
        errors += [FieldError("Invalid", f"{where}.key", key, m) for m in qualified_name_errors(key)]
    return errors


def _nonnegative(value: Any, path: str) -> list[FieldError]:
    if isinstance(value, int) and value < 0:
        return [FieldError("Invalid", path, value, "must be greater than or equal to 0")]
    return []


def _percent(value: Any) -> int | None:
    return int(value[:-1]) if isinstance(value, str) and re.fullmatch("[0-9]+%", value) else None


def _int_or_percent(value: Any) -> int:
    """getIntOrPercentValue: a percent's number, an int, or 0 for anything else (Atoi failing)."""
    percent = _percent(value)
    if percent is not None:
        return percent
    if isinstance(value, str):
        return int(value) if re.fullmatch("[+-]?[0-9]+", value) else 0
    return value if isinstance(value, int) else 0


def _rolling_update_errors(rolling: Obj, path: str) -> list[FieldError]:
    """ValidateRollingUpdateDaemonSet: int or percent, at most 100%, exactly one of the two non-zero."""
    errors: list[FieldError] = []
    keys = ("maxUnavailable", "maxSurge")
    for key in keys:
        value = rolling.get(key)
        if isinstance(value, str) and _percent(value) is None:
            errors.append(FieldError("Invalid", f"{path}.{key}", _go_int_or_string(value), _PERCENT_MSG))
        errors += _nonnegative(value, f"{path}.{key}")
    for key in keys:
        if (_percent(rolling.get(key)) or 0) > 100:
            value = _go_int_or_string(rolling[key])
            errors.append(FieldError("Invalid", f"{path}.{key}", value, "must not be greater than 100%"))
    unavailable, surge = (_int_or_percent(rolling.get(key)) for key in keys)
    if unavailable and surge:
        value = _go_int_or_string(rolling.get("maxSurge"))
        errors.append(
            FieldError("Invalid", f"{path}.maxSurge", value, "may not be set when maxUnavailable is non-zero")
        )
    elif not unavailable and not surge:
        errors.append(FieldError("Required", f"{path}.maxUnavailable", detail="cannot be 0 when maxSurge is 0"))
    return errors


def _update_strategy_errors(strategy: Obj) -> list[FieldError]:
    kind = strategy.get("type")
    if kind == "OnDelete":
        return []
    if kind != "RollingUpdate":
        # Go prints the rollingUpdate pointer's address where there is one; "nil" is all that can be reproduced.
        rolling = "nil" if strategy.get("rollingUpdate") is None else "0xc000000000"
        value = GoSyntax(
            f"apps.DaemonSetUpdateStrategy{{Type:{_go_quote(kind or '')}, "
            f"RollingUpdate:(*apps.RollingUpdateDaemonSet)({rolling})}}"
        )
        return [supported("spec.updateStrategy", value, ("RollingUpdate", "OnDelete"))]
    rolling_update = strategy.get("rollingUpdate")
    if not isinstance(rolling_update, dict):
        return [FieldError("Required", "spec.updateStrategy.rollingUpdate")]
    return _rolling_update_errors(rolling_update, "spec.updateStrategy.rollingUpdate")


def _validate_daemon_set(obj: Obj, old: Obj | None) -> list[FieldError]:
    spec = obj.get("spec") or {}
    template = spec.get("template") or {}
    template_spec = template.get("spec") or {}
    labels = (template.get("metadata") or {}).get("labels")
    selector = spec.get("selector")
    errors = _label_selector_errors(selector, "spec.selector")
    # A missing selector selects nothing, so it can only fail to match; a broken one is not matched at all.
    requirements = selector_requirements(selector) if isinstance(selector, dict) else []
    if selector is None or (requirements is not None and not all(r.matches(labels or {}) for r in requirements)):
        errors.append(
            FieldError(
                "Invalid",
                "spec.template.metadata.labels",
                _go_string_map(labels),
                "`selector` does not match template `labels`",
            )
        )
    if isinstance(selector, dict) and not (selector.get("matchLabels") or selector.get("matchExpressions")):
        errors.append(
            FieldError(
                "Invalid", "spec.selector", _go_label_selector(selector), "empty selector is invalid for daemonset"
            )
        )
    errors += pod_spec_errors(template_spec, "spec.template.spec")
    restart_policy = template_spec.get("restartPolicy")
    if restart_policy != "Always":
        errors.append(supported("spec.template.spec.restartPolicy", restart_policy or "", ("Always",)))
    if template_spec.get("activeDeadlineSeconds") is not None:
        detail = "activeDeadlineSeconds in DaemonSet is not Supported"
        errors.append(FieldError("Forbidden", "spec.template.spec.activeDeadlineSeconds", detail=detail))
    errors += _nonnegative(spec.get("minReadySeconds"), "spec.minReadySeconds")
    errors += _update_strategy_errors(spec.get("updateStrategy") or {})
    errors += _nonnegative(spec.get("revisionHistoryLimit"), "spec.revisionHistoryLimit")
    if old is not None and selector != (old.get("spec") or {}).get("selector"):
        errors.append(FieldError("Invalid", "spec.selector", _go_label_selector(selector), "field is immutable"))
    return errors


DAEMON_SETS = ResourceType(
    name="daemonsets",
    singular="daemonset",
    kind="DaemonSet",
    namespaced=True,
    group=APPS_GROUP,
    short_names=("ds",),
    categories=("all",),
    has_status=True,
    fields=NAME_FIELDS,
    default_field_conversion=True,
    merge_lists={
        **COMMON_MERGE_LISTS,
        **{f"spec.template.{path}": key for path, key in COMMON_MERGE_LISTS.items()},
        **{f"spec.template.{path}": key for path, key in POD_MERGE_LISTS.items() if path.startswith("spec.")},
        "status.conditions": "type",
    },
    default=_default_daemon_set,
    prepare_for_create=_prepare_daemon_set_create,
    prepare_for_update=_prepare_daemon_set_update,
    validate=_validate_daemon_set,
)
