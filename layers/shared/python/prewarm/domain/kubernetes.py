"""Kubernetes object rules every manifest shares: naming, labels, metadata and label selectors.

Models built on `KubernetesModel` accept YAML-shaped dicts and report every problem as a
`JobValidationError` naming the Kubernetes-style field path (`spec.images[3]`,
`metadata.labels[app]`). Validators raise `FieldProblems` for problems below the value they check.
"""

from __future__ import annotations

import re
import types
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any, ClassVar, Literal, NamedTuple, Self, TypeVar, Union, get_args, get_origin

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator
from pydantic.alias_generators import to_camel
from pydantic_core import ErrorDetails

MAX_NAME_LENGTH = 253

# --- Kubernetes naming rules -------------------------------------------------------------------

_DNS1123_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
_DNS1123_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
_QUALIFIED_NAME_PART = re.compile(r"([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]")

_SUBDOMAIN_HINT = (
    "must consist of lower case alphanumeric characters, '-' or '.', "
    "and must start and end with an alphanumeric character (e.g. 'example.com')"
)
_LABEL_HINT = (
    "must consist of lower case alphanumeric characters or '-', "
    "and must start and end with an alphanumeric character (e.g. 'my-name')"
)
_NAME_PART_HINT = (
    "must consist of alphanumeric characters, '-', '_' or '.', "
    "and must start and end with an alphanumeric character (e.g. 'MyName' or 'my.name')"
)


def format_time(epoch: float) -> str:
    """RFC 3339 UTC, to the second, as Kubernetes writes times."""
    return datetime.fromtimestamp(int(epoch), UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_time(value: object) -> float | None:
    """Epoch seconds of an RFC 3339 time with a zone (as Kubernetes writes them), or None when `value`
    is not one."""
    if not isinstance(value, str):
        return None
    try:
        parsed = datetime.fromisoformat(value)
    except ValueError:
        return None
    return parsed.timestamp() if parsed.tzinfo is not None else None


def _dns_name_problem(value: str, limit: int, pattern: re.Pattern[str], hint: str) -> str | None:
    if not value:
        return "must not be empty"
    if len(value) > limit:
        return f"must be no more than {limit} characters (got {len(value)})"
    if not pattern.fullmatch(value):
        return f'"{value}" {hint}'
    return None


def dns1123_subdomain_problem(value: str) -> str | None:
    """Why `value` is not a DNS-1123 subdomain (object names such as an ImagePullJob's), or None."""
    return _dns_name_problem(value, 253, _DNS1123_SUBDOMAIN, _SUBDOMAIN_HINT)


def dns1123_label_problem(value: str) -> str | None:
    """Why `value` is not a DNS-1123 label (namespace names), or None."""
    return _dns_name_problem(value, 63, _DNS1123_LABEL, _LABEL_HINT)


def qualified_name_problem(key: str) -> str | None:
    """Why `key` is not a qualified name (`[prefix/]name`, label and annotation keys), or None."""
    prefix, slash, name = key.rpartition("/")
    if slash and not prefix:
        return f'key "{key}": prefix part must not be empty'
    if prefix and (problem := dns1123_subdomain_problem(prefix)):
        return f'key "{key}": prefix part {problem}'
    if not name:
        return f'key "{key}": name part must not be empty'
    if len(name) > 63:
        return f'key "{key}": name part must be no more than 63 characters'
    if not _QUALIFIED_NAME_PART.fullmatch(name):
        return f'key "{key}": name part {_NAME_PART_HINT}'
    return None


def label_value_problem(value: str) -> str | None:
    """Why `value` is not a valid label value (empty is valid), or None."""
    if len(value) > 63:
        return f'value "{value}" must be no more than 63 characters'
    if value and not _QUALIFIED_NAME_PART.fullmatch(value):
        return f'value "{value}" {_NAME_PART_HINT}'
    return None


class FieldProblems(ValueError):
    """Problems found by a validator, each at a path relative to the value it validated.

    Raised inside pydantic validators; `KubernetesModel` turns them into `JobValidationError`
    entries whose paths join the validated value's path with each relative one (`[2]`, `.values`).
    """

    def __init__(self, problems: list[tuple[str, str]]) -> None:
        self.problems = problems
        super().__init__("; ".join(f"{path}: {message}" if path else message for path, message in problems))


def raise_problems(problems: list[tuple[str, str]]) -> None:
    """Raise `FieldProblems` when there is anything in `problems`."""
    if problems:
        raise FieldProblems(problems)


def label_map_problems(labels: Mapping[str, str], *, check_values: bool = True) -> list[tuple[str, str]]:
    """Problems of a labels (or, with `check_values=False`, annotations) map, at `[key]` paths."""
    problems: list[tuple[str, str]] = []
    for key, value in labels.items():
        problem = qualified_name_problem(key) or (label_value_problem(value) if check_values else None)
        if problem:
            problems.append((f"[{key}]", problem))
    return problems


# --- Errors --------------------------------------------------------------------------------------


class FieldError(NamedTuple):
    """One problem: the Kubernetes-style path of the field at fault and what is wrong with it."""

    path: str
    message: str

    def __str__(self) -> str:
        return f"{self.path}: {self.message}" if self.path else self.message


class JobValidationError(ValueError):
    """A manifest that is not a valid job or rule; `errors` lists every `(field_path, message)`."""

    def __init__(
        self,
        errors: Sequence[tuple[str, str]],
        subject: str | None = None,
        *,
        parts: Sequence[JobValidationError] = (),
    ) -> None:
        self.errors = [FieldError(*error) for error in errors]
        self.subject = subject
        self.parts = list(parts)
        super().__init__(str(self))

    @classmethod
    def combine(cls, parts: Sequence[JobValidationError]) -> JobValidationError:
        """One error for several invalid documents, keeping each document's subject."""
        return cls([error for part in parts for error in part.errors], parts=parts)

    def __str__(self) -> str:
        if self.parts:
            return "\n".join(str(part) for part in self.parts)
        lines = [str(error) for error in self.errors]
        body = lines[0] if len(lines) == 1 else "\n".join(f"  - {line}" for line in lines)
        if not self.subject:
            return body
        return f"{self.subject} is invalid:{' ' if len(lines) == 1 else chr(10)}{body}"


def _unwrap_optional(annotation: Any) -> Any:
    if get_origin(annotation) in (Union, types.UnionType):
        members = [arg for arg in get_args(annotation) if arg is not type(None)]
        if len(members) == 1:
            return members[0]
    return annotation


def _is_model(annotation: Any) -> bool:
    return isinstance(annotation, type) and issubclass(annotation, BaseModel)


def _field_annotation(model: type[BaseModel], alias: str) -> Any:
    for name, field in model.model_fields.items():
        if alias in (field.alias, name):
            return field.annotation
    return None


def _walk(root: type[BaseModel], loc: Sequence[int | str]) -> tuple[str, Any]:
    """Render a pydantic `loc` as a Kubernetes field path; also return the type found there."""
    path = ""
    current: Any = root
    for part in loc:
        current = _unwrap_optional(current)
        origin = get_origin(current)
        if _is_model(current) and isinstance(part, str):
            path = f"{path}.{part}" if path else part
            current = _field_annotation(current, part)
        elif origin is list and isinstance(part, int):
            path += f"[{part}]"
            current = get_args(current)[0]
        elif origin is dict:
            if part == "[key]":
                continue
            path += f"[{part}]"
            current = get_args(current)[1]
        else:
            path += f"[{part}]" if isinstance(part, int) else (f".{part}" if path else part)
            current = None
    return path, _unwrap_optional(current)


def describe_value(value: Any) -> str:
    if isinstance(value, bool):
        return f"boolean {str(value).lower()}"
    if isinstance(value, int | float):
        return f"number {value}"
    if isinstance(value, str):
        return f'string "{value}"'
    if isinstance(value, list):
        return "a list"
    if isinstance(value, dict):
        return "a mapping"
    return "null" if value is None else type(value).__name__


def quoted_choices(choices: Sequence[Any]) -> str:
    return ", ".join(f'"{choice}"' for choice in choices)


_TYPE_WORDS = {
    "int_type": "an integer",
    "int_from_float": "an integer",
    "bool_type": "true or false",
    "list_type": "a list",
    "dict_type": "a mapping",
    "model_type": "a mapping",
    "model_attributes_type": "a mapping",
}


def _message(error: ErrorDetails, root: type[BaseModel]) -> tuple[str, str]:
    """Translate one pydantic error into (path, message) in the words of the manifest."""
    kind = error["type"]
    ctx = error.get("ctx") or {}
    value = error.get("input")
    loc = error["loc"]
    path, found = _walk(root, loc)
    if kind == "missing":
        return path, "required"
    if kind == "extra_forbidden":
        _, parent = _walk(root, loc[:-1])
        known = [f.alias or n for n, f in parent.model_fields.items()] if _is_model(parent) else []
        hint = f"; known fields: {', '.join(known)}" if known else ""
        return path, f'unknown field "{loc[-1]}"{hint}'
    if loc and loc[-1] == "[key]":
        return path, f"keys must be strings (got {describe_value(value)})"
    if kind == "string_type":
        hint = "; quote it in YAML" if isinstance(value, int | float | bool) else ""
        return path, f"must be a string (got {describe_value(value)}){hint}"
    if kind in _TYPE_WORDS:
        return path, f"must be {_TYPE_WORDS[kind]} (got {describe_value(value)})"
    if kind == "literal_error":
        choices = get_args(found) if get_origin(found) is Literal else ()
        supported = quoted_choices(choices) if choices else str(ctx.get("expected", ""))
        return path, f'unsupported value "{value}": supported values: {supported}'
    if kind == "value_error":
        return path, str(ctx.get("error", "invalid value"))
    bounds = {
        "greater_than_equal": ("greater than or equal to", "ge"),
        "greater_than": ("greater than", "gt"),
        "less_than_equal": ("less than or equal to", "le"),
        "less_than": ("less than", "lt"),
    }
    if kind in bounds:
        words, key = bounds[kind]
        return path, f"must be {words} {ctx.get(key)} (got {value})"
    if kind == "too_short":
        return path, f"must have at least {ctx.get('min_length')} item(s)"
    if kind == "too_long":
        return path, f"must have at most {ctx.get('max_length')} item(s)"
    return path, f"invalid value ({describe_value(value)})"


def _translate(error: ValidationError, root: type[BaseModel]) -> list[tuple[str, str]]:
    problems: list[tuple[str, str]] = []
    for item in error.errors(include_url=False):
        cause = (item.get("ctx") or {}).get("error")
        if item["type"] == "value_error" and isinstance(cause, FieldProblems):
            base, _ = _walk(root, item["loc"])
            for relative, message in cause.problems:
                text = message.replace("{at}.", f"{base}." if base else "")
                problems.append((f"{base}{relative}".lstrip("."), text))
        else:
            problems.append(_message(item, root))
    return problems


_ModelT = TypeVar("_ModelT", bound="KubernetesModel")


def manifest_subject(doc: Any) -> str | None:
    """`<kind> <namespace>/<name>` (or `<kind> <name>` for a rule) as far as `doc` tells."""
    if not isinstance(doc, Mapping):
        return None
    kind = doc["kind"] if isinstance(doc.get("kind"), str) else "object"
    metadata = doc.get("metadata")
    if not isinstance(metadata, Mapping) or not isinstance(metadata.get("name"), str):
        return str(kind)
    if kind == "PrewarmRule":
        return f"{kind} {metadata['name']}"
    namespace = metadata.get("namespace")
    return f"{kind} {namespace if isinstance(namespace, str) else 'default'}/{metadata['name']}"


# --- Models --------------------------------------------------------------------------------------


class KubernetesModel(BaseModel):
    """A strict, frozen model of a Kubernetes object part, read from and written as camelCase YAML."""

    model_config = ConfigDict(strict=True, extra="forbid", frozen=True, alias_generator=to_camel, populate_by_name=True)

    @classmethod
    def from_manifest(cls: type[_ModelT], doc: Any) -> _ModelT:
        """Validate a YAML-shaped dict, raising `JobValidationError` with Kubernetes field paths."""
        try:
            return cls.model_validate(doc)
        except ValidationError as e:
            raise JobValidationError(_translate(e, cls), manifest_subject(doc)) from None

    def to_manifest(self) -> dict[str, Any]:
        """The YAML-shaped dict: camelCase names, defaults filled in, server-set fields left out."""
        return self.model_dump(by_alias=True, mode="json", exclude_none=True)


class WithLabels(KubernetesModel):
    """Valid `labels` and `annotations` (qualified-name keys; label values checked too)."""

    labels: dict[str, str] | None = None
    annotations: dict[str, str] | None = None

    @field_validator("labels")
    @classmethod
    def _labels_are_valid(cls, labels: dict[str, str] | None) -> dict[str, str] | None:
        raise_problems(label_map_problems(labels or {}))
        return labels

    @field_validator("annotations")
    @classmethod
    def _annotation_keys_are_valid(cls, annotations: dict[str, str] | None) -> dict[str, str] | None:
        raise_problems(label_map_problems(annotations or {}, check_values=False))
        return annotations


class InNamespace(KubernetesModel):
    """A `namespace` that is a DNS-1123 label, `default` when left out."""

    namespace: str = "default"

    @field_validator("namespace")
    @classmethod
    def _namespace_is_label(cls, namespace: str) -> str:
        if problem := dns1123_label_problem(namespace):
            raise ValueError(problem)
        return namespace


class ObjectMeta(WithLabels):
    """`metadata` of a cluster-wide object: `name` plus labels and annotations.

    Fields the API server sets (`uid`, `resourceVersion`, `managedFields`, ...) are accepted so that
    `kubectl get -o yaml` output loads, but they are never written back by `to_manifest`.
    """

    name: str
    generate_name: Any = Field(default=None, exclude=True)
    uid: Any = Field(default=None, exclude=True)
    resource_version: Any = Field(default=None, exclude=True)
    generation: Any = Field(default=None, exclude=True)
    creation_timestamp: Any = Field(default=None, exclude=True)
    deletion_timestamp: Any = Field(default=None, exclude=True)
    deletion_grace_period_seconds: Any = Field(default=None, exclude=True)
    finalizers: Any = Field(default=None, exclude=True)
    owner_references: Any = Field(default=None, exclude=True)
    managed_fields: Any = Field(default=None, exclude=True)
    self_link: Any = Field(default=None, exclude=True)

    @field_validator("name")
    @classmethod
    def _name_is_subdomain(cls, name: str) -> str:
        if problem := dns1123_subdomain_problem(name):
            raise ValueError(problem)
        return name


class NamespacedObjectMeta(ObjectMeta, InNamespace):
    """`metadata` of a namespaced object; `namespace` defaults to `default`."""


def bounded_name(prefix: str, suffix: str) -> str:
    """`<prefix>-<suffix>`, the prefix cut so the name stays within the object name limit."""
    room = MAX_NAME_LENGTH - len(suffix) - 1
    return f"{prefix[:room].rstrip('-.')}-{suffix}"


# --- Label selectors ---------------------------------------------------------------------------

Operator = Literal["In", "NotIn", "Exists", "DoesNotExist"]
_INTEGER = re.compile(r"[+-]?[0-9]+")


def requirement_holds(operator: str, values: Sequence[str], value: str | None) -> bool:
    """Whether a label (or field) `value`, None when the object has none, meets `operator` over `values`.

    Kubernetes' `labels.Requirement.Matches`: `NotIn` and `DoesNotExist` hold without the key; `Gt` and
    `Lt` (node affinity only) compare the value and the one entry of `values` as integers, and fail when
    either is not one. An unknown operator holds for nothing.
    """
    if operator == "Exists":
        return value is not None
    if operator == "DoesNotExist":
        return value is None
    if operator in ("In", "NotIn"):
        inside = value is not None and value in values
        return inside if operator == "In" else not inside
    if operator in ("Gt", "Lt") and value is not None and len(values) == 1:
        if not (_INTEGER.fullmatch(value) and _INTEGER.fullmatch(values[0])):
            return False
        number, bound = int(value), int(values[0])
        return number > bound if operator == "Gt" else number < bound
    return False


class LabelSelectorRequirement(KubernetesModel):
    """One `matchExpressions` entry: `key`, `operator` and (for In/NotIn) `values`."""

    key: str
    operator: Operator
    values: list[str] | None = None

    @field_validator("key")
    @classmethod
    def _key_is_qualified_name(cls, key: str) -> str:
        if problem := qualified_name_problem(key):
            raise ValueError(problem)
        return key

    @model_validator(mode="after")
    def _values_fit_operator(self) -> LabelSelectorRequirement:
        problems: list[tuple[str, str]] = []
        if self.operator in ("In", "NotIn"):
            if not self.values:
                problems.append((".values", f"must be non-empty when operator is {self.operator}"))
            for index, value in enumerate(self.values or ()):
                if problem := label_value_problem(value):
                    problems.append((f".values[{index}]", problem))
        elif self.values:
            problems.append((".values", f"must be empty when operator is {self.operator}"))
        raise_problems(problems)
        return self

    def matches(self, labels: Mapping[str, str]) -> bool:
        """Whether `labels` satisfy this requirement, with Kubernetes semantics."""
        return requirement_holds(self.operator, self.values or (), labels.get(self.key))

    def to_query(self) -> str:
        """This requirement in `labelSelector` query syntax."""
        if self.operator == "Exists":
            return self.key
        if self.operator == "DoesNotExist":
            return f"!{self.key}"
        word = "in" if self.operator == "In" else "notin"
        return f"{self.key} {word} ({','.join(sorted(set(self.values or ())))})"


class LabelSelector(KubernetesModel):
    """A Kubernetes label selector: `matchLabels` and `matchExpressions`, all of which must hold."""

    match_labels: dict[str, str] | None = None
    match_expressions: list[LabelSelectorRequirement] | None = None

    @field_validator("match_labels")
    @classmethod
    def _labels_are_valid(cls, labels: dict[str, str] | None) -> dict[str, str] | None:
        raise_problems(label_map_problems(labels or {}))
        return labels

    def matches(self, labels: Mapping[str, str] | None) -> bool:
        """Whether an object with `labels` is selected (an empty selector matches everything)."""
        labels = labels or {}
        if any(labels.get(key) != value for key, value in (self.match_labels or {}).items()):
            return False
        return all(requirement.matches(labels) for requirement in self.match_expressions or ())

    def to_query(self) -> str:
        """The `labelSelector` query string, e.g. `a=b,c in (x,y),!d,e`, sorted so it is deterministic."""
        terms = [(key, f"{key}={value}") for key, value in (self.match_labels or {}).items()]
        terms += [(requirement.key, requirement.to_query()) for requirement in self.match_expressions or ()]
        return ",".join(dict.fromkeys(term for _, term in sorted(terms)))


class NamesOrLabelSelector(LabelSelector):
    """A selector of `names`, or a label selector (not both): the base of a job's node selector
    (`prewarm.domain.placement.NodeSelector`) and a rule's cluster selector
    (`prewarm.domain.clusters.ClusterSelector`). A subclass says what a name is (`noun`) and when one is
    invalid (`name_problem`)."""

    noun: ClassVar[str] = "name"
    names: list[str] | None = None

    @classmethod
    def name_problem(cls, name: str) -> str | None:
        """Why `name` cannot be selected by name, or None."""
        return None

    @field_validator("names")
    @classmethod
    def _names_are_distinct_valid_names(cls, names: list[str] | None) -> list[str] | None:
        problems: list[tuple[str, str]] = []
        seen: dict[str, int] = {}
        for index, name in enumerate(names or ()):
            if problem := cls.name_problem(name):
                problems.append((f"[{index}]", f"invalid {cls.noun}: {problem}"))
            elif name in seen:
                problems.append((f"[{index}]", f'duplicate {cls.noun} "{name}" (also at [{seen[name]}])'))
            seen.setdefault(name, index)
        raise_problems(problems)
        return names

    @model_validator(mode="after")
    def _names_or_labels(self) -> Self:
        if self.names is not None and (self.match_labels is not None or self.match_expressions is not None):
            raise_problems([("", "names cannot be combined with matchLabels or matchExpressions; use one")])
        return self
