"""Name, label and key rules of k8s.io/apimachinery/pkg/util/validation, with the real error wording."""

from __future__ import annotations

import re
from functools import lru_cache

from prewarm_devtools.kubeapi.errors import FieldError

_QUALIFIED_NAME_FMT = "([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]"
_LABEL_VALUE_FMT = "(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?"
_DNS1123_LABEL_FMT = "[a-z0-9]([-a-z0-9]*[a-z0-9])?"
_DNS1123_SUBDOMAIN_FMT = _DNS1123_LABEL_FMT + r"(\." + _DNS1123_LABEL_FMT + ")*"
_CONFIG_KEY_FMT = "[-._a-zA-Z0-9]+"

_QUALIFIED_NAME = re.compile(_QUALIFIED_NAME_FMT)
_LABEL_VALUE = re.compile(_LABEL_VALUE_FMT)
_DNS1123_LABEL = re.compile(_DNS1123_LABEL_FMT)
_DNS1123_SUBDOMAIN = re.compile(_DNS1123_SUBDOMAIN_FMT)
_CONFIG_KEY = re.compile(_CONFIG_KEY_FMT)

_QUALIFIED_NAME_MSG = (
    "must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an "
    "alphanumeric character (e.g. 'MyName',  or 'my.name',  or '123-abc', regex used for validation is "
    f"'{_QUALIFIED_NAME_FMT}')"
)
_LABEL_VALUE_MSG = (
    "a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or '.', and "
    "must start and end with an alphanumeric character (e.g. 'MyValue',  or 'my_value',  or '12345', regex "
    f"used for validation is '{_LABEL_VALUE_FMT}')"
)
_DNS1123_LABEL_MSG = (
    "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and must start "
    "and end with an alphanumeric character (e.g. 'my-name',  or '123-abc', regex used for validation is "
    f"'{_DNS1123_LABEL_FMT}')"
)
_DNS1123_SUBDOMAIN_MSG = (
    "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and "
    "must start and end with an alphanumeric character (e.g. 'example.com', regex used for validation is "
    f"'{_DNS1123_SUBDOMAIN_FMT}')"
)
_CONFIG_KEY_MSG = (
    "a valid config key must consist of alphanumeric characters, '-', '_' or '.' (e.g. 'key.name',  or "
    f"'KEY_NAME',  or 'key-name', regex used for validation is '{_CONFIG_KEY_FMT}')"
)


def _max_len(n: int) -> str:
    return f"must be no more than {n} characters"


def dns1123_label_errors(value: str) -> list[str]:
    errors = [_max_len(63)] if len(value) > 63 else []
    if not _DNS1123_LABEL.fullmatch(value):
        errors.append(_DNS1123_LABEL_MSG)
    return errors


def dns1123_subdomain_errors(value: str) -> list[str]:
    errors = [_max_len(253)] if len(value) > 253 else []
    if not _DNS1123_SUBDOMAIN.fullmatch(value):
        errors.append(_DNS1123_SUBDOMAIN_MSG)
    return errors


@lru_cache(maxsize=4096)
def qualified_name_errors(value: str) -> tuple[str, ...]:
    """Errors of a label or annotation key: `[prefix/]name`, prefix a DNS subdomain."""
    parts = value.split("/")
    if len(parts) == 1:
        name = parts[0]
        errors: list[str] = []
    elif len(parts) == 2:
        prefix, name = parts
        if not prefix:
            errors = ["prefix part must be non-empty"]
        else:
            errors = ["prefix part " + e for e in dns1123_subdomain_errors(prefix)]
    else:
        return (
            "a qualified name " + _QUALIFIED_NAME_MSG + " with an optional DNS subdomain prefix and '/' "
            "(e.g. 'example.com/MyName')",
        )
    if not name:
        errors.append("name part must be non-empty")
    elif len(name) > 63:
        errors.append("name part " + _max_len(63))
    if name and not _QUALIFIED_NAME.fullmatch(name):
        errors.append("name part " + _QUALIFIED_NAME_MSG)
    return tuple(errors)


@lru_cache(maxsize=65536)
def label_value_errors(value: str) -> tuple[str, ...]:
    errors = [_max_len(63)] if len(value) > 63 else []
    if not _LABEL_VALUE.fullmatch(value):
        errors.append(_LABEL_VALUE_MSG)
    return tuple(errors)


def config_key_errors(value: str) -> list[str]:
    errors = [_max_len(253)] if len(value) > 253 else []
    if not _CONFIG_KEY.fullmatch(value):
        errors.append(_CONFIG_KEY_MSG)
    if value in (".", ".."):
        errors.append(f"must not be '{value}'")
    elif value.startswith(".."):
        errors.append("must not start with '..'")
    return errors


def path_segment_errors(value: str) -> list[str]:
    """Errors of a name that only has to be a URL path segment (RBAC roles and bindings)."""
    if value in (".", ".."):
        return [f"may not be '{value}'"]
    return [f"may not contain '{c}'" for c in ("/", "%") if c in value]


def metadata_errors(
    metadata: dict[str, object], *, name_is_label: bool, namespaced: bool, path_segment_name: bool = False
) -> list[FieldError]:
    """Validation of `metadata`: name, labels, annotations (ValidateObjectMeta)."""
    errors: list[FieldError] = []
    name = metadata.get("name")
    if not name:
        errors.append(FieldError("Required", "metadata.name", detail="name or generateName is required"))
    elif not isinstance(name, str):
        errors.append(FieldError("Invalid", "metadata.name", name, "must be a string"))
    else:
        if path_segment_name:
            messages = path_segment_errors(name)
        else:
            messages = dns1123_label_errors(name) if name_is_label else dns1123_subdomain_errors(name)
        for message in messages:
            errors.append(FieldError("Invalid", "metadata.name", name, message))
    if namespaced and not metadata.get("namespace"):
        errors.append(FieldError("Required", "metadata.namespace"))
    labels = metadata.get("labels")
    if labels is not None:
        if not isinstance(labels, dict):
            errors.append(FieldError("Invalid", "metadata.labels", labels, "must be a map of strings"))
        else:
            for key, value in labels.items():
                errors += [FieldError("Invalid", "metadata.labels", key, m) for m in qualified_name_errors(key)]
                if not isinstance(value, str):
                    errors.append(FieldError("Invalid", "metadata.labels", value, "label values must be strings"))
                    continue
                errors += [FieldError("Invalid", "metadata.labels", value, m) for m in label_value_errors(value)]
    annotations = metadata.get("annotations")
    if annotations is not None:
        if not isinstance(annotations, dict):
            errors.append(FieldError("Invalid", "metadata.annotations", annotations, "must be a map of strings"))
        else:
            size = 0
            for key, value in annotations.items():
                errors += [FieldError("Invalid", "metadata.annotations", key, m) for m in qualified_name_errors(key)]
                if not isinstance(value, str):
                    errors.append(
                        FieldError("Invalid", "metadata.annotations", value, "annotation values must be strings")
                    )
                    continue
                size += len(key) + len(value.encode())
            if size > 256 * 1024:
                errors.append(FieldError("TooLong", "metadata.annotations", detail="must have at most 262144 bytes"))
    return errors
