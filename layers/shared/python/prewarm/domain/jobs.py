"""OpenKruise `ImagePullJob` / `ImageListPullJob` manifests and Prewarm's `PrewarmRule`, validated.

The models accept Kruise YAML verbatim (`apps.kruise.io/v1alpha1` or `v1beta1`, or Prewarm's own
`prewarm.dev/v1alpha1`), fill in Kruise's defaults and apply the rules of Kruise's admission webhook.
Every problem is reported as a `JobValidationError` naming the Kubernetes-style field path
(`spec.images[3]`, `spec.completionPolicy.activeDeadlineSeconds`).
"""

from __future__ import annotations

import fnmatch
import hashlib
import json
import re
import types
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, Literal, NamedTuple, TypeVar, Union, get_args, get_origin

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator
from pydantic.alias_generators import to_camel
from pydantic_core import ErrorDetails

from prewarm.domain.images import InvalidImageReference, digest_problem, parse_image
from prewarm.domain.selection import (
    FieldProblems,
    LabelSelector,
    dns1123_label_problem,
    dns1123_subdomain_problem,
    label_map_problems,
    raise_problems,
)

KRUISE_API_VERSIONS = ("apps.kruise.io/v1alpha1", "apps.kruise.io/v1beta1")
PREWARM_API_VERSION = "prewarm.dev/v1alpha1"
JOB_API_VERSIONS = (*KRUISE_API_VERSIONS, PREWARM_API_VERSION)
JobApiVersion = Literal["apps.kruise.io/v1alpha1", "apps.kruise.io/v1beta1", "prewarm.dev/v1alpha1"]

MAX_IMAGES = 255
INT32_MAX = 2**31 - 1
MAX_NAME_LENGTH = 253

# Annotations Prewarm puts on the jobs it derives, so their origin can be traced.
RULE_ANNOTATION = "prewarm.dev/rule"
REPOSITORY_ANNOTATION = "prewarm.dev/repository"
TAG_ANNOTATION = "prewarm.dev/tag"
LIST_JOB_ANNOTATION = "prewarm.dev/image-list-pull-job"

_ECR_HOST = re.compile(r"(?P<account>\d{12})\.dkr\.ecr(?:-fips)?\.(?P<region>[a-z0-9-]+)\.amazonaws\.com(?:\.cn)?")
_ACCOUNT_ID = re.compile(r"\d{12}")
_REGION = re.compile(r"[a-z]{2}(?:-[a-z]+)+-\d+")


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


def _describe(value: Any) -> str:
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


def _quoted_choices(choices: Sequence[Any]) -> str:
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
        return path, f"keys must be strings (got {_describe(value)})"
    if kind == "string_type":
        hint = "; quote it in YAML" if isinstance(value, int | float | bool) else ""
        return path, f"must be a string (got {_describe(value)}){hint}"
    if kind in _TYPE_WORDS:
        return path, f"must be {_TYPE_WORDS[kind]} (got {_describe(value)})"
    if kind == "literal_error":
        choices = get_args(found) if get_origin(found) is Literal else ()
        supported = _quoted_choices(choices) if choices else str(ctx.get("expected", ""))
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
    return path, f"invalid value ({_describe(value)})"


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


_ModelT = TypeVar("_ModelT", bound="_Model")


def _subject(doc: Any) -> str | None:
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


class _Model(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid", frozen=True, alias_generator=to_camel, populate_by_name=True)

    @classmethod
    def from_manifest(cls: type[_ModelT], doc: Any) -> _ModelT:
        """Validate a YAML-shaped dict, raising `JobValidationError` with Kubernetes field paths."""
        try:
            return cls.model_validate(doc)
        except ValidationError as e:
            raise JobValidationError(_translate(e, cls), _subject(doc)) from None

    def to_manifest(self) -> dict[str, Any]:
        """The YAML-shaped dict: camelCase names, defaults filled in, server-set fields left out."""
        return self.model_dump(by_alias=True, mode="json", exclude_none=True)


class _Annotated(_Model):
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


class _InNamespace(_Model):
    namespace: str = "default"

    @field_validator("namespace")
    @classmethod
    def _namespace_is_label(cls, namespace: str) -> str:
        if problem := dns1123_label_problem(namespace):
            raise ValueError(problem)
        return namespace


class ObjectMeta(_Annotated):
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


class NamespacedObjectMeta(ObjectMeta, _InNamespace):
    """`metadata` of a namespaced object; `namespace` defaults to `default`."""


class PullPolicy(_Model):
    """`spec.pullPolicy`: per-node pull timeout and retries (Kruise defaults 600 s and 3)."""

    timeout_seconds: int = Field(default=600, ge=1, le=INT32_MAX)
    backoff_limit: int = Field(default=3, ge=0, le=INT32_MAX)


class CompletionPolicy(_Model):
    """`spec.completionPolicy`: `Always` jobs finish; `Never` jobs keep nodes warm until deleted."""

    type: Literal["Always", "Never"] = "Always"
    active_deadline_seconds: int | None = Field(default=None, ge=1)
    ttl_seconds_after_finished: int | None = Field(default=None, ge=0, le=INT32_MAX)


class SandboxConfig(_Model):
    """`spec.sandboxConfig`: labels and annotations passed to the CRI PullImage sandbox config."""

    labels: dict[str, str] | None = None
    annotations: dict[str, str] | None = None


class ImagePullJobNodeSelector(LabelSelector):
    """`spec.selector`: node `names`, or a label selector over nodes (not both)."""

    names: list[str] | None = None

    @field_validator("names")
    @classmethod
    def _names_are_distinct_node_names(cls, names: list[str] | None) -> list[str] | None:
        problems: list[tuple[str, str]] = []
        seen: dict[str, int] = {}
        for index, name in enumerate(names or ()):
            if problem := dns1123_subdomain_problem(name):
                problems.append((f"[{index}]", f"invalid node name: {problem}"))
            elif name in seen:
                problems.append((f"[{index}]", f'duplicate node name "{name}" (also at [{seen[name]}])'))
            seen.setdefault(name, index)
        raise_problems(problems)
        return names

    @model_validator(mode="after")
    def _names_or_labels(self) -> ImagePullJobNodeSelector:
        if self.names is not None and (self.match_labels is not None or self.match_expressions is not None):
            raise_problems([("", "names cannot be combined with matchLabels or matchExpressions; use one")])
        return self


_ALWAYS_ONLY = "may only be set when {at}.completionPolicy.type is Always"


class ImagePullJobTemplate(_Model):
    """Everything of an ImagePullJob spec but the image: where, how fast and how long to pull."""

    pull_secrets: list[str] | None = None
    selector: ImagePullJobNodeSelector | None = None
    pod_selector: LabelSelector | None = None
    parallelism: int = Field(default=1, ge=0, le=INT32_MAX)
    pull_policy: PullPolicy = Field(default_factory=PullPolicy)
    completion_policy: CompletionPolicy = Field(default_factory=CompletionPolicy)
    sandbox_config: SandboxConfig | None = None
    image_pull_policy: Literal["Always", "IfNotPresent"] = "IfNotPresent"

    @field_validator("parallelism", mode="before")
    @classmethod
    def _parallelism_is_a_count(cls, value: Any) -> Any:
        if value is None:
            return 1
        if isinstance(value, str):
            raise ValueError(
                f'must be an integer number of nodes (got string "{value}"); percentages are not supported'
            )
        return value

    @field_validator("pull_policy", "completion_policy", mode="before")
    @classmethod
    def _null_policy_means_defaults(cls, value: Any) -> Any:
        return {} if value is None else value

    @field_validator("pull_secrets")
    @classmethod
    def _secret_names_are_valid(cls, names: list[str] | None) -> list[str] | None:
        problems = [
            (f"[{index}]", f"invalid secret name: {problem}")
            for index, name in enumerate(names or ())
            if (problem := dns1123_subdomain_problem(name))
        ]
        raise_problems(problems)
        return names

    @model_validator(mode="after")
    def _policies_and_selectors_agree(self) -> ImagePullJobTemplate:
        problems: list[tuple[str, str]] = []
        if self.pod_selector is not None and self.selector is not None:
            problems.append((".podSelector", "cannot be combined with {at}.selector; use one of them"))
        completion = self.completion_policy
        if completion.type == "Never":
            for alias, value in (
                ("activeDeadlineSeconds", completion.active_deadline_seconds),
                ("ttlSecondsAfterFinished", completion.ttl_seconds_after_finished),
            ):
                if value is not None:
                    problems.append((f".completionPolicy.{alias}", _ALWAYS_ONLY))
        elif (
            completion.active_deadline_seconds is not None
            and completion.active_deadline_seconds < self.pull_policy.timeout_seconds
        ):
            problems.append(
                (
                    ".completionPolicy.activeDeadlineSeconds",
                    f"must be >= {{at}}.pullPolicy.timeoutSeconds ({self.pull_policy.timeout_seconds})",
                )
            )
        raise_problems(problems)
        return self


def _image_problem(image: str) -> str | None:
    if not image:
        return "must not be empty"
    try:
        parse_image(image)
    except InvalidImageReference as e:
        return str(e)
    return None


class ImagePullJobSpec(ImagePullJobTemplate):
    """`spec` of an ImagePullJob: the template plus the `image` to pull."""

    image: str

    @field_validator("image")
    @classmethod
    def _image_is_valid(cls, image: str) -> str:
        if problem := _image_problem(image):
            raise ValueError(problem)
        return image


class ImageListPullJobSpec(ImagePullJobTemplate):
    """`spec` of an ImageListPullJob: the template plus 1 to 255 distinct `images`."""

    images: list[str]

    @field_validator("images")
    @classmethod
    def _images_are_valid_and_distinct(cls, images: list[str]) -> list[str]:
        if not images:
            raise ValueError("must list at least one image")
        if len(images) > MAX_IMAGES:
            raise ValueError(f"must list at most {MAX_IMAGES} images (got {len(images)})")
        problems: list[tuple[str, str]] = []
        seen: dict[str, int] = {}
        for index, image in enumerate(images):
            if problem := _image_problem(image):
                problems.append((f"[{index}]", problem))
                continue
            reference = parse_image(image).pull_reference
            if reference in seen:
                first = seen[reference]
                same = "" if images[first] == image else f' "{images[first]}", both {reference}'
                problems.append((f"[{index}]", f'duplicate image "{image}" (same as [{first}]{same})'))
            seen.setdefault(reference, index)
        raise_problems(problems)
        return images


def _sorted_unique(values: Any) -> Any:
    return sorted(set(values)) if isinstance(values, list) else values


def _canonical_selector(selector: Any) -> Any:
    if not isinstance(selector, dict):
        return selector
    result = dict(selector)
    if "names" in result:
        result["names"] = _sorted_unique(result["names"])
    expressions = result.get("matchExpressions")
    if isinstance(expressions, list):
        normalised = [{**e, "values": _sorted_unique(e["values"])} if "values" in e else e for e in expressions]
        result["matchExpressions"] = sorted(normalised, key=lambda e: json.dumps(e, sort_keys=True))
    return result


def canonical_spec(spec: Mapping[str, Any]) -> dict[str, Any]:
    """A spec dict (camelCase) with set-like lists sorted, so equal specs compare and hash equal."""
    result = dict(spec)
    for key in ("pullSecrets", "images"):
        if key in result:
            result[key] = _sorted_unique(result[key])
    for key in ("selector", "podSelector"):
        if key in result:
            result[key] = _canonical_selector(result[key])
    return result


def _hash_spec(spec: BaseModel) -> str:
    dumped = spec.model_dump(by_alias=True, mode="json", exclude_none=True)
    canonical = json.dumps(canonical_spec(dumped), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()


def _bounded_name(prefix: str, suffix: str) -> str:
    room = MAX_NAME_LENGTH - len(suffix) - 1
    return f"{prefix[:room].rstrip('-.')}-{suffix}"


class _Job(_Model):
    api_version: JobApiVersion
    kind: str
    metadata: NamespacedObjectMeta
    spec: Any
    status: Any = Field(default=None, exclude=True)

    @property
    def name(self) -> str:
        return self.metadata.name

    @property
    def namespace(self) -> str:
        return self.metadata.namespace

    @property
    def key(self) -> str:
        """`namespace/name`, the job's identity."""
        return f"{self.metadata.namespace}/{self.metadata.name}"

    def spec_hash(self) -> str:
        """SHA-256 of the canonical JSON of the normalised spec: equal for the same spec applied twice."""
        return _hash_spec(self.spec)

    def to_manifest(self) -> dict[str, Any]:
        """The YAML-shaped dict, defaults filled in, keys in the order people write them."""
        doc = super().to_manifest()
        doc["metadata"] = {"name": self.name, "namespace": self.namespace, **doc["metadata"]}
        spec = doc["spec"]
        doc["spec"] = {**{key: spec[key] for key in ("image", "images") if key in spec}, **spec}
        return doc


class ImagePullJob(_Job):
    """An OpenKruise ImagePullJob: pull one image on the selected nodes."""

    kind: Literal["ImagePullJob"]
    spec: ImagePullJobSpec


class ImageListPullJob(_Job):
    """An OpenKruise ImageListPullJob: one ImagePullJob per image, sharing one template."""

    kind: Literal["ImageListPullJob"]
    spec: ImageListPullJobSpec

    def child_jobs(self) -> Iterator[ImagePullJob]:
        """One ImagePullJob per image, as Kruise creates them, named `<list>-<10 hex of the image's hash>`.

        A hash rather than the list index keeps each child's name when images are added,
        removed or reordered, so unchanged images are not pulled again.
        """
        template = self.spec.model_dump(by_alias=True, mode="json", exclude_none=True, exclude={"images"})
        annotations = {**(self.metadata.annotations or {}), LIST_JOB_ANNOTATION: self.name}
        for image in self.spec.images:
            suffix = hashlib.sha256(image.encode()).hexdigest()[:10]
            metadata: dict[str, Any] = {
                "name": _bounded_name(self.name, suffix),
                "namespace": self.namespace,
                "annotations": annotations,
            }
            if self.metadata.labels:
                metadata["labels"] = self.metadata.labels
            yield ImagePullJob.from_manifest(
                {
                    "apiVersion": self.api_version,
                    "kind": "ImagePullJob",
                    "metadata": metadata,
                    "spec": {**template, "image": image},
                }
            )


# --- PrewarmRule ---------------------------------------------------------------------------------


class RuleTemplateMetadata(_InNamespace, _Annotated):
    """`spec.template.metadata`: where the jobs a rule creates live, and their labels/annotations."""


class RuleTemplate(_Model):
    """`spec.template`: the ImagePullJob spec (without `image`) of every job the rule creates."""

    metadata: RuleTemplateMetadata = Field(default_factory=RuleTemplateMetadata)
    spec: ImagePullJobTemplate = Field(default_factory=ImagePullJobTemplate)

    @model_validator(mode="after")
    def _jobs_must_finish(self) -> RuleTemplate:
        if self.spec.completion_policy.type != "Always":
            raise_problems(
                [(".spec.completionPolicy.type", "must be Always: each push creates a job that must finish")]
            )
        return self


def _patterns_problems(patterns: list[str], what: str) -> list[tuple[str, str]]:
    return [
        (f"[{index}]", f"must be a non-empty {what} glob without spaces")
        for index, pattern in enumerate(patterns)
        if not pattern or any(c.isspace() for c in pattern)
    ]


def ecr_registry(host: str) -> tuple[str, str] | None:
    """`(account_id, region)` of an ECR registry host (`123456789012.dkr.ecr.eu-west-1.amazonaws.com`)."""
    match = _ECR_HOST.fullmatch(host)
    return (match["account"], match["region"]) if match else None


class PrewarmRuleSpec(_Model):
    """`spec` of a PrewarmRule: which pushed images to pre-warm and the job template to use."""

    repositories: list[str] = Field(min_length=1)
    tags: list[str] = Field(default_factory=lambda: ["*"], min_length=1)
    include_untagged: bool = False
    registries: list[str] | None = None
    account_ids: list[str] | None = None
    regions: list[str] | None = None
    template: RuleTemplate = Field(default_factory=RuleTemplate)

    @field_validator("repositories", "tags", "registries")
    @classmethod
    def _globs_are_usable(cls, patterns: list[str] | None) -> list[str] | None:
        raise_problems(_patterns_problems(patterns or [], "pattern"))
        return patterns

    @field_validator("account_ids", mode="before")
    @classmethod
    def _account_ids_are_quoted(cls, values: Any) -> Any:
        if isinstance(values, list):
            problems = [
                (
                    f"[{index}]",
                    f'must be a 12-digit string such as "123456789012"; got {_describe(value)}'
                    + ("; quote it in YAML" if isinstance(value, int) else ""),
                )
                for index, value in enumerate(values)
                if not isinstance(value, str) or not _ACCOUNT_ID.fullmatch(value)
            ]
            raise_problems(problems)
        return values

    @field_validator("regions")
    @classmethod
    def _regions_are_valid(cls, regions: list[str] | None) -> list[str] | None:
        problems = [
            (f"[{index}]", f'"{region}" is not an AWS region name such as "us-east-1"')
            for index, region in enumerate(regions or [])
            if not _REGION.fullmatch(region)
        ]
        raise_problems(problems)
        return regions


def _any_glob(value: str, patterns: Sequence[str]) -> bool:
    return any(fnmatch.fnmatchcase(value, pattern) for pattern in patterns)


class PrewarmRule(_Model):
    """Prewarm's rule: pushes to matching ECR repositories and tags become ImagePullJobs.

    Globs use shell rules (`*`, `?`, `[abc]`); `*` also matches `/`, so `team/*` covers nested
    repositories.
    """

    api_version: Literal["prewarm.dev/v1alpha1"]
    kind: Literal["PrewarmRule"]
    metadata: ObjectMeta
    spec: PrewarmRuleSpec
    status: Any = Field(default=None, exclude=True)

    @property
    def name(self) -> str:
        return self.metadata.name

    def spec_hash(self) -> str:
        """SHA-256 of the canonical JSON of the spec."""
        return _hash_spec(self.spec)

    def _registry_matches(self, registry: str | None) -> bool:
        spec = self.spec
        if spec.registries is None and spec.account_ids is None and spec.regions is None:
            return True
        # A rule limited to some registries cannot vouch for a push from an unknown one.
        if registry is None:
            return False
        if spec.registries is not None and not _any_glob(registry, spec.registries):
            return False
        if spec.account_ids is None and spec.regions is None:
            return True
        ecr = ecr_registry(registry)
        if ecr is None:
            return False
        account, region = ecr
        return (spec.account_ids is None or account in spec.account_ids) and (
            spec.regions is None or region in spec.regions
        )

    def matches(self, repository: str, tag: str | None, registry: str | None = None) -> bool:
        """Whether a push of `repository` with `tag` (None or "" when untagged) is pre-warmed by this rule.

        When the rule has `registries`, `accountIds` or `regions`, `registry` (the registry host)
        must be given and match them.
        """
        if not _any_glob(repository, self.spec.repositories) or not self._registry_matches(registry):
            return False
        if not tag:
            return self.spec.include_untagged
        return _any_glob(tag, self.spec.tags)

    def job_for_push(self, registry_host: str, repository: str, digest: str, tag: str | None = None) -> ImagePullJob:
        """The `Always` ImagePullJob for a pushed image, pinned to `<registry>/<repository>@<digest>`.

        It is named `<rule>-<first 12 hex of the digest>` and lives in `spec.template.metadata.namespace`.
        Call `matches` first: this does not check the push against the rule's patterns.
        """
        if problem := digest_problem(digest):
            raise JobValidationError([("digest", problem)])
        if not registry_host or not repository:
            raise JobValidationError([("image", "registry host and repository must not be empty")])
        template = self.spec.template
        annotations = {
            **(template.metadata.annotations or {}),
            RULE_ANNOTATION: self.name,
            REPOSITORY_ANNOTATION: repository,
        }
        if tag:
            annotations[TAG_ANNOTATION] = tag
        metadata: dict[str, Any] = {
            "name": _bounded_name(self.name, digest.partition(":")[2][:12]),
            "namespace": template.metadata.namespace,
            "annotations": annotations,
        }
        if template.metadata.labels:
            metadata["labels"] = template.metadata.labels
        spec = template.spec.model_dump(by_alias=True, mode="json", exclude_none=True)
        return ImagePullJob.from_manifest(
            {
                "apiVersion": PREWARM_API_VERSION,
                "kind": "ImagePullJob",
                "metadata": metadata,
                "spec": {**spec, "image": f"{registry_host}/{repository}@{digest}"},
            }
        )


# --- Parsing -------------------------------------------------------------------------------------

Manifest = ImagePullJob | ImageListPullJob | PrewarmRule

_KINDS: dict[str, tuple[type[ImagePullJob] | type[ImageListPullJob] | type[PrewarmRule], tuple[str, ...]]] = {
    "ImagePullJob": (ImagePullJob, JOB_API_VERSIONS),
    "ImageListPullJob": (ImageListPullJob, JOB_API_VERSIONS),
    "PrewarmRule": (PrewarmRule, (PREWARM_API_VERSION,)),
}


def parse_manifest(doc: Any) -> Manifest:
    """Validate one manifest dict, choosing the model by `apiVersion` and `kind`."""
    if not isinstance(doc, Mapping):
        message = f"a manifest must be a mapping with apiVersion and kind (got {_describe(doc)})"
        raise JobValidationError([("", message)])
    subject = _subject(doc)
    kind, api_version = doc.get("kind"), doc.get("apiVersion")
    if kind is None:
        raise JobValidationError([("kind", "required")], subject)
    if not isinstance(kind, str) or kind not in _KINDS:
        message = f'unsupported kind "{kind}": supported kinds are {", ".join(_KINDS)}'
        raise JobValidationError([("kind", message)], subject)
    model, versions = _KINDS[kind]
    if api_version is None:
        raise JobValidationError([("apiVersion", "required")], subject)
    if api_version not in versions:
        message = f'unsupported apiVersion "{api_version}" for kind {kind}: use {_quoted_choices(versions)}'
        raise JobValidationError([("apiVersion", message)], subject)
    return model.from_manifest(doc)


def parse_manifests(text: str) -> list[Manifest]:
    """Validate every document of a multi-document YAML string (a `kind: List` is unpacked).

    All invalid documents are reported together, each named by its position and kind/name.
    """
    try:
        documents = [doc for doc in yaml.safe_load_all(text) if doc is not None]
    except yaml.YAMLError as e:
        raise JobValidationError([("", f"invalid YAML: {e}")]) from None
    items: list[Any] = []
    for doc in documents:
        unpack = isinstance(doc, Mapping) and doc.get("kind") == "List" and isinstance(doc.get("items"), list)
        items.extend(doc["items"] if unpack else [doc])
    manifests: list[Manifest] = []
    failures: list[JobValidationError] = []
    for number, doc in enumerate(items, start=1):
        try:
            manifests.append(parse_manifest(doc))
        except JobValidationError as e:
            where = f"document {number}" + (f" ({e.subject})" if e.subject else "")
            failures.append(JobValidationError(e.errors, where))
    if failures:
        raise JobValidationError.combine(failures)
    return manifests
