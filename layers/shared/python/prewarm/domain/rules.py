"""Prewarm's `PrewarmRule`: which pushed ECR images become ImagePullJobs, and with what template."""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Sequence
from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from prewarm.domain.clusters import ClusterSelector
from prewarm.domain.images import digest_problem
from prewarm.domain.jobs import (
    NODE_LABEL_ANNOTATION,
    PREWARM_API_VERSION,
    CompletionType,
    ImagePullJob,
    ImagePullJobTemplate,
    StackObject,
    seed_wave_of,
)
from prewarm.domain.kubernetes import (
    InNamespace,
    JobValidationError,
    KubernetesModel,
    WithLabels,
    bounded_name,
    describe_value,
    qualified_name_problem,
    raise_problems,
)
from prewarm.domain.push import REGION as _REGION
from prewarm.domain.registries import parse_ecr_registry

# Annotations Prewarm puts on the jobs a rule derives, so their origin can be traced.
RULE_ANNOTATION = "prewarm.dev/rule"
REPOSITORY_ANNOTATION = "prewarm.dev/repository"
TAG_ANNOTATION = "prewarm.dev/tag"
# A rule's job whose template sets no `ttlSecondsAfterFinished` is deleted a day after it finished: pushes
# never stop, and finished jobs left for ever would be listed by every sweep and `prewarm get jobs`.
RULE_JOB_TTL_SECONDS = 86_400
# A rule without `keepDigests` keeps one earlier digest of a tag warm: the one a rollback would go back to.
DEFAULT_KEEP_DIGESTS = 1
KEEP_DIGESTS_MAX = 100

_ACCOUNT_ID = re.compile(r"[0-9]{12}")
_GLOB = re.compile(r"\S+")
# The same rules as RE2 patterns, for the CRD's schema (cli/prewarm_cli/install/crds.py).
ACCOUNT_ID_PATTERN = f"^{_ACCOUNT_ID.pattern}$"
REGION_PATTERN = f"^{_REGION.pattern}$"
GLOB_PATTERN = f"^{_GLOB.pattern}$"


class RuleTemplateMetadata(InNamespace, WithLabels):
    """`spec.template.metadata`: where the jobs a rule creates live, and their labels/annotations."""

    @field_validator("annotations")
    @classmethod
    def _seed_wave_is_valid(cls, annotations: dict[str, str] | None) -> dict[str, str] | None:
        # Checked when the rule is applied, not at its first push's job.
        seed_wave_of(annotations)
        return annotations


class RuleTemplate(KubernetesModel):
    """`spec.template`: the ImagePullJob spec (without `image`) of every job the rule creates."""

    metadata: RuleTemplateMetadata = Field(default_factory=RuleTemplateMetadata)
    spec: ImagePullJobTemplate = Field(default_factory=ImagePullJobTemplate)

    @model_validator(mode="after")
    def _jobs_must_finish(self) -> RuleTemplate:
        if CompletionType(self.spec.completion_policy.type) is not CompletionType.ALWAYS:
            raise_problems(
                [(".spec.completionPolicy.type", "must be Always: each push creates a job that must finish")]
            )
        return self


def _patterns_problems(patterns: list[str], what: str) -> list[tuple[str, str]]:
    return [
        (f"[{index}]", f"must be a non-empty {what} glob without spaces")
        for index, pattern in enumerate(patterns)
        if not _GLOB.fullmatch(pattern)
    ]


class PrewarmRuleSpec(KubernetesModel):
    """`spec` of a PrewarmRule: which pushed images to pre-warm and the job template to use."""

    repositories: list[str] = Field(min_length=1)
    tags: list[str] = Field(default_factory=lambda: ["*"], min_length=1)
    include_untagged: bool = False
    registries: list[str] | None = None
    account_ids: list[str] | None = None
    regions: list[str] | None = None
    # The clusters a push's jobs go to: by name or by label; absent, every cluster the stack serves.
    clusters: ClusterSelector | None = None
    # How many earlier digests of a tag stay warm once a new one is pushed (`prewarm.domain.lifecycle`).
    keep_digests: int | None = Field(default=None, ge=0, le=KEEP_DIGESTS_MAX)
    # A label key put on each node (value "true") once the images of the rule's jobs there are all present,
    # for pods' node affinity (`prewarm.domain.boot.label_patch`).
    node_label: str | None = None
    template: RuleTemplate = Field(default_factory=RuleTemplate)

    @property
    def kept_digests(self) -> int:
        """`keepDigests`, or its default."""
        return DEFAULT_KEEP_DIGESTS if self.keep_digests is None else self.keep_digests

    @field_validator("repositories", "tags", "registries")
    @classmethod
    def _globs_are_usable(cls, patterns: list[str] | None) -> list[str] | None:
        raise_problems(_patterns_problems(patterns or [], "pattern"))
        return patterns

    @field_validator("node_label")
    @classmethod
    def _node_label_is_a_label_key(cls, key: str | None) -> str | None:
        if key is not None and (problem := qualified_name_problem(key)):
            raise_problems([("", problem)])
        return key

    @field_validator("account_ids", mode="before")
    @classmethod
    def _account_ids_are_quoted(cls, values: Any) -> Any:
        if isinstance(values, list):
            problems = [
                (
                    f"[{index}]",
                    f'must be a 12-digit string such as "123456789012"; got {describe_value(value)}'
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


class PrewarmRule(StackObject):
    """Prewarm's rule: pushes to matching ECR repositories and tags become ImagePullJobs.

    Globs use shell rules (`*`, `?`, `[abc]`); `*` also matches `/`, so `team/*` covers nested
    repositories.
    """

    kind: Literal["PrewarmRule"]
    spec: PrewarmRuleSpec

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
        ecr = parse_ecr_registry(registry)
        if ecr is None or ecr.public:
            return False
        return (spec.account_ids is None or ecr.account in spec.account_ids) and (
            spec.regions is None or ecr.region in spec.regions
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

    def pushes_to(self, repository: str, registry: str | None = None) -> bool:
        """Whether some push of `repository` (whatever its tag) may be this rule's: its image may be one of the
        rule's jobs'."""
        return _any_glob(repository, self.spec.repositories) and self._registry_matches(registry)

    def job_for_push(self, registry_host: str, repository: str, digest: str, tag: str | None = None) -> ImagePullJob:
        """The `Always` ImagePullJob for a pushed image, pinned to `<registry>/<repository>@<digest>`.

        It is named `<rule>-<first 12 hex of the digest>` and lives in `spec.template.metadata.namespace`;
        without a `ttlSecondsAfterFinished` of the template's, it is deleted `RULE_JOB_TTL_SECONDS` after it
        finished.
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
        if self.spec.node_label:
            annotations[NODE_LABEL_ANNOTATION] = self.spec.node_label
        metadata: dict[str, Any] = {
            "name": bounded_name(self.name, digest.partition(":")[2][:12]),
            "namespace": template.metadata.namespace,
            "annotations": annotations,
        }
        if template.metadata.labels:
            metadata["labels"] = template.metadata.labels
        spec = template.spec.model_dump(by_alias=True, mode="json", exclude_none=True)
        spec["completionPolicy"] = {"ttlSecondsAfterFinished": RULE_JOB_TTL_SECONDS, **spec.get("completionPolicy", {})}
        return ImagePullJob.from_manifest(
            {
                "apiVersion": PREWARM_API_VERSION,
                "kind": "ImagePullJob",
                "metadata": metadata,
                "spec": {**spec, "image": f"{registry_host}/{repository}@{digest}"},
            }
        )
