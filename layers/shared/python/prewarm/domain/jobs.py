"""OpenKruise `ImagePullJob` and `ImageListPullJob` manifests, validated, and the state of a stored job.

The models accept Kruise YAML verbatim (`apps.kruise.io/v1alpha1` or `v1beta1`, or Prewarm's own
`prewarm.dev/v1alpha1`), fill in Kruise's defaults and apply the rules of Kruise's admission webhook.
Every problem is reported as a `JobValidationError` naming the Kubernetes-style field path
(`spec.images[3]`, `spec.completionPolicy.activeDeadlineSeconds`).
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterator, Mapping
from enum import StrEnum
from typing import Any, Literal

from pydantic import BaseModel, Field, field_validator, model_validator

from prewarm.domain.clusters import DEFAULT_CLUSTER
from prewarm.domain.images import (
    _IDENTIFIER_RE,
    DIGEST_HEX_LENGTHS,
    NAME_PATTERN,
    TAG_PATTERN,
    InvalidImageReference,
    parse_image,
)
from prewarm.domain.keys import JobKey
from prewarm.domain.kubernetes import (
    _DNS1123_LABEL,
    _DNS1123_SUBDOMAIN,
    _QUALIFIED_NAME_PART,
    KubernetesModel,
    LabelSelector,
    NamespacedObjectMeta,
    ObjectMeta,
    bounded_name,
    dns1123_subdomain_problem,
    raise_problems,
)
from prewarm.domain.placement import SEED_WAVE_ANNOTATION, NodeSelector, Placement, SeedWave

KRUISE_API_VERSIONS = ("apps.kruise.io/v1alpha1", "apps.kruise.io/v1beta1")
PREWARM_API_VERSION = "prewarm.dev/v1alpha1"
# The annotation by which a rule's job carries the rule's `spec.nodeLabel` (`PrewarmRule.job_for_push`): the
# node label `prewarm.domain.boot` keeps on the nodes that have the job's image.
NODE_LABEL_ANNOTATION = "prewarm.dev/node-label"
JOB_API_VERSIONS = (*KRUISE_API_VERSIONS, PREWARM_API_VERSION)
JobApiVersion = Literal["apps.kruise.io/v1alpha1", "apps.kruise.io/v1beta1", "prewarm.dev/v1alpha1"]

MAX_IMAGES = 255
INT32_MAX = 2**31 - 1
# Longer than any reference the grammar allows (host and port, a 255-character path, tag and digest): a bound
# the CRD needs so that the API server can afford its duplicate check over `images`.
IMAGE_MAX_LENGTH = 1024

# --- The model's string rules as RE2 patterns ------------------------------------------------------
# cli/prewarm_cli/install/crds.py puts them in the CRDs' schemas, so that the API server refuses at
# `kubectl apply` what the model refuses; tests/unit/install/test_job_rules.py runs one table of cases
# through both. What they cannot say (a repository path over 255 characters, label keys in a map) stays
# with the model.
_DIGESTS = "|".join(f"{algorithm}:[a-f0-9]{{{length}}}" for algorithm, length in DIGEST_HEX_LENGTHS.items())
IMAGE_PATTERN = f"^{NAME_PATTERN}(?::{TAG_PATTERN})?(?:@(?:{_DIGESTS}))?$"
IMAGE_ID_PATTERN = f"^{_IDENTIFIER_RE.pattern}$"
DNS1123_SUBDOMAIN_PATTERN = f"^{_DNS1123_SUBDOMAIN.pattern}$"
DNS1123_LABEL_PATTERN = f"^{_DNS1123_LABEL.pattern}$"
# The name part of a key, at most 63 characters: the qualified-name rule with its length said as a bound.
LABEL_KEY_PATTERN = f"^(?:{_DNS1123_SUBDOMAIN.pattern}/)?[A-Za-z0-9](?:[-A-Za-z0-9_.]{{0,61}}[A-Za-z0-9])?$"
LABEL_VALUE_PATTERN = f"^(?:{_QUALIFIED_NAME_PART.pattern})?$"

# Put on the children of an ImageListPullJob, so their origin can be traced.
LIST_JOB_ANNOTATION = "prewarm.dev/image-list-pull-job"
# "true": agents pin the job's image in containerd, so kubelet's image garbage collection keeps it
# (containerd >= 1.7.10 and kubelet >= 1.29; docs/agent.md, "Pinning").
PIN_ANNOTATION = "prewarm.dev/pin"


class JobState(StrEnum):
    """Where a stored job stands; stored and shown as its value."""

    RUNNING = "Running"
    COMPLETED = "Completed"
    FAILED = "Failed"
    DELETING = "Deleting"

    @property
    def is_finished(self) -> bool:
        """Completed and Failed jobs do no more work until they are applied again."""
        return self in (JobState.COMPLETED, JobState.FAILED)


class CompletionType(StrEnum):
    """`spec.completionPolicy.type`: `Always` jobs finish; `Never` jobs keep nodes warm until deleted."""

    ALWAYS = "Always"
    NEVER = "Never"


def job_key(namespace: str, name: str, cluster: str = DEFAULT_CLUSTER) -> JobKey:
    """A job's identity in the store and in messages (`prewarm.domain.keys`): `namespace/name`, prefixed
    `<cluster>:` when the job belongs to a registered cluster other than the stack's own."""
    return JobKey(namespace, name, cluster)


class PullPolicy(KubernetesModel):
    """`spec.pullPolicy`: per-node pull timeout and retries (Kruise defaults 600 s and 3)."""

    timeout_seconds: int = Field(default=600, ge=1, le=INT32_MAX)
    backoff_limit: int = Field(default=3, ge=0, le=INT32_MAX)


class CompletionPolicy(KubernetesModel):
    """`spec.completionPolicy`: `Always` jobs finish; `Never` jobs keep nodes warm until deleted."""

    # A Literal, not the enum: strict models take enum fields only as enum instances, not YAML strings.
    type: Literal["Always", "Never"] = "Always"
    active_deadline_seconds: int | None = Field(default=None, ge=1)
    ttl_seconds_after_finished: int | None = Field(default=None, ge=0, le=INT32_MAX)


class SandboxConfig(KubernetesModel):
    """`spec.sandboxConfig`: labels and annotations passed to the CRI PullImage sandbox config."""

    labels: dict[str, str] | None = None
    annotations: dict[str, str] | None = None


_ALWAYS_ONLY = "may only be set when {at}.completionPolicy.type is Always"
# Kruise's webhook parses a string parallelism with strconv.ParseInt(s, 10, 32): an optional sign, then digits.
# At most 10 digits (int32's), so that a CEL rule can take int() of it safely.
_PARALLELISM_STRING = re.compile(r"[+-]?[0-9]{1,10}")
PARALLELISM_STRING_PATTERN = f"^{_PARALLELISM_STRING.pattern}$"
PARALLELISM_PERCENT = "percentages such as {value} are not supported: give a number of nodes such as 5 or \"5\""
PARALLELISM_NOT_A_NUMBER = "must be a number of nodes such as 5 or \"5\" (got {value})"


def parallelism_from_string(value: str) -> int:
    """A string `parallelism` as Kruise reads it: `"50"` is 50 (its webhook parses the string and its
    controller takes `IntValue()`); a percentage or anything but an int32 number is refused."""
    if value.endswith("%"):
        raise ValueError(PARALLELISM_PERCENT.format(value=json.dumps(value)))
    if not _PARALLELISM_STRING.fullmatch(value) or not -(2**31) <= int(value) <= INT32_MAX:
        raise ValueError(PARALLELISM_NOT_A_NUMBER.format(value=json.dumps(value)))
    return int(value)


class ImagePullJobTemplate(KubernetesModel):
    """Everything of an ImagePullJob spec but the image: where, how fast and how long to pull."""

    pull_secrets: list[str] | None = None
    # True: pull with `pull_secrets` only, never with credentials shared by every job (docs/credentials.md,
    # "Own pull secrets only"). False is stored as absent, so jobs applied before the field hash the same.
    pull_secrets_only: bool | None = None
    selector: NodeSelector | None = None
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
            return parallelism_from_string(value)
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

    @field_validator("pull_secrets_only")
    @classmethod
    def _false_is_absent(cls, value: bool | None) -> bool | None:
        return value or None

    @model_validator(mode="after")
    def _policies_and_selectors_agree(self) -> ImagePullJobTemplate:
        problems: list[tuple[str, str]] = []
        if self.pull_secrets_only and not self.pull_secrets:
            problems.append((".pullSecretsOnly", "true needs at least one secret in {at}.pullSecrets to pull with"))
        if self.pod_selector is not None and self.selector is not None:
            problems.append((".podSelector", "cannot be combined with {at}.selector; use one of them"))
        completion = self.completion_policy
        if CompletionType(completion.type) is CompletionType.NEVER:
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
    if len(image) > IMAGE_MAX_LENGTH:
        return f"must be no more than {IMAGE_MAX_LENGTH} characters (got {len(image)})"
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


def hash_spec(spec: BaseModel) -> str:
    """SHA-256 of the canonical JSON of a normalised spec model: equal for equal specs."""
    dumped = spec.model_dump(by_alias=True, mode="json", exclude_none=True)
    canonical = json.dumps(canonical_spec(dumped), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()


class StackObject(KubernetesModel):
    """A cluster-scoped Prewarm object that belongs to the stack (`PrewarmRule`, `WarmSnapshot`): its
    name, its spec (declared by each kind) and the spec's hash; a stored status is left out."""

    api_version: Literal["prewarm.dev/v1alpha1"]
    metadata: ObjectMeta
    spec: Any
    status: Any = Field(default=None, exclude=True)

    @property
    def name(self) -> str:
        return self.metadata.name

    def spec_hash(self) -> str:
        """SHA-256 of the canonical JSON of the spec."""
        return hash_spec(self.spec)


class NamespacedManifest(KubernetesModel):
    """A namespaced kind's manifest: its name, namespace and key; a status given is read and dropped."""
    metadata: NamespacedObjectMeta
    status: Any = Field(default=None, exclude=True)

    @property
    def name(self) -> str:
        return self.metadata.name

    @property
    def namespace(self) -> str:
        return self.metadata.namespace

    @property
    def key(self) -> JobKey:
        """`namespace/name`, the object's identity."""
        return job_key(self.metadata.namespace, self.metadata.name)


def seed_wave_of(annotations: Mapping[str, str] | None) -> SeedWave | None:
    """The seed wave an object's annotations ask for (`prewarm.dev/seed-wave`), None when they do not."""
    value = (annotations or {}).get(SEED_WAVE_ANNOTATION)
    return None if value is None else SeedWave.parse(value)


# A job's annotations that change what it does: applying one added, changed or removed is a change.
_ACTING_ANNOTATIONS = frozenset({PIN_ANNOTATION, SEED_WAVE_ANNOTATION})


class _Job(NamespacedManifest):
    api_version: JobApiVersion
    kind: str
    spec: Any

    @field_validator("metadata")
    @classmethod
    def _pin_is_true_or_false(cls, metadata: NamespacedObjectMeta) -> NamespacedObjectMeta:
        value = (metadata.annotations or {}).get(PIN_ANNOTATION)
        if value is not None and value not in ("true", "false"):
            raise ValueError(f'annotations.{PIN_ANNOTATION}: must be "true" or "false", not {value!r}')
        seed_wave_of(metadata.annotations)
        return metadata

    @property
    def pin(self) -> bool:
        """Whether the agents pin the image (annotation `prewarm.dev/pin: "true"`)."""
        return (self.metadata.annotations or {}).get(PIN_ANNOTATION) == "true"

    @property
    def seed_wave(self) -> SeedWave | None:
        """The job's seed wave (annotation `prewarm.dev/seed-wave`), None without one."""
        return seed_wave_of(self.metadata.annotations)

    @property
    def placement(self) -> Placement:
        """The selectors and namespace that decide which nodes the job pulls on."""
        return Placement(self.spec.selector, self.spec.pod_selector, self.metadata.namespace)

    def spec_hash(self) -> str:
        """SHA-256 of the canonical JSON of the normalised spec, and of the annotations that change what the job
        does (pin, seed wave): equal for the same job applied twice, changed by a pin or wave added or removed.
        A job with neither annotation hashes its spec alone, as before these counted."""
        spec = hash_spec(self.spec)
        acting = {k: v for k, v in sorted((self.metadata.annotations or {}).items()) if k in _ACTING_ANNOTATIONS}
        if not acting:
            return spec
        return hashlib.sha256(json.dumps([spec, acting], separators=(",", ":")).encode()).hexdigest()

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
                "name": bounded_name(self.name, suffix),
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


# The secret types the kubelet (and the agent) read registry credentials from.
PULL_SECRET_TYPES = ("kubernetes.io/dockerconfigjson", "kubernetes.io/dockercfg")


def own_pull_secret_problems(
    spec: ImagePullJobTemplate, namespace: str, found: Mapping[str, Mapping[str, Any] | None], *, at: str
) -> list[tuple[str, str]]:
    """With `pullSecretsOnly`, each secret of `pullSecrets` that `found` (name → the secret read from
    `namespace`, None when there is none) shows missing or of another type: such a job could pull with
    nothing. `at` is the spec's path (`spec`, `spec.template.spec`)."""
    if not spec.pull_secrets_only:
        return []
    problems = []
    for index, name in enumerate(spec.pull_secrets or ()):
        secret = found.get(name)
        where = f"{at}.pullSecrets[{index}]"
        if secret is None:
            problems.append((where, f'secret "{name}" not found in namespace "{namespace}": {at}.pullSecretsOnly '
                                    "pulls with these secrets only; create it first"))
        elif (kind := secret.get("type")) not in PULL_SECRET_TYPES:
            problems.append((where, f'secret "{name}" in namespace "{namespace}" is of type "{kind}", not '
                                    f"{' or '.join(PULL_SECRET_TYPES)}: it holds no registry credentials"))
    return problems
