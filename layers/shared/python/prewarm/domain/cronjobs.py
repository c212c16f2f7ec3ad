"""OpenKruise's `AdvancedCronJob` with an `imageListPullJobTemplate` (Kruise 1.9, `apps.kruise.io/v1beta1`), and
the rules of its runs as Kruise's controller applies them.

The model takes Kruise's YAML verbatim, fills in what Kruise's defaulting webhook fills in
(apis/apps/defaults/v1beta1.go, SetDefaultsAdvancedCronJob) and refuses what its validating webhook refuses
(pkg/webhook/advancedcronjob/validating). Prewarm runs only the image list template: a `jobTemplate` or
`broadcastJobTemplate` (pods) is refused, naming the field.

A run is an ImageListPullJob named `<cron job>-<scheduled time in Unix seconds>`, annotated with the scheduled
time (`apps.kruise.io/scheduled-at`, RFC 3339), as Kruise's controller names and marks it: the same scheduled
time always makes the same run, so a schedule fired twice creates it once. What to do when a run is due
(`plan_run`), which finished runs go (`expired_runs`) and the cron job's status (`cron_status`) are pure
functions of the runs.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from prewarm.domain.cron import CronSchedule, CronScheduleError, time_zone_problem
from prewarm.domain.jobs import (
    INT32_MAX,
    PREWARM_API_VERSION,
    ImageListPullJob,
    ImageListPullJobSpec,
    NamespacedManifest,
    PullPolicy,
    hash_spec,
)
from prewarm.domain.keys import JobKey
from prewarm.domain.kubernetes import (
    KubernetesModel,
    NamespacedObjectMeta,
    WithLabels,
    format_time,
    raise_problems,
)

KRUISE_CRON_API_VERSION = "apps.kruise.io/v1beta1"
CRON_API_VERSIONS = (KRUISE_CRON_API_VERSION, PREWARM_API_VERSION)
# Kruise's v1alpha1 AdvancedCronJob has no imageListPullJobTemplate; its CRD prunes the field, so the webhook
# then finds no template and refuses the object.
V1ALPHA1_REFUSED = ("apps.kruise.io/v1alpha1 AdvancedCronJob has no spec.template.imageListPullJobTemplate "
                    "(Kruise added it in v1beta1): use apps.kruise.io/v1beta1")
SCHEDULED_AT_ANNOTATION = "apps.kruise.io/scheduled-at"
# On each run, so its cron job can be found from it (Kruise sets an owner reference), and which one: a cron
# job deleted and applied again under its name is another, whose runs are not those the first left running.
CRON_JOB_ANNOTATION = "prewarm.dev/advanced-cron-job"
CRON_JOB_UID_ANNOTATION = "prewarm.dev/advanced-cron-job-uid"
# Kruise's webhook: the name pattern and length of an AdvancedCronJob, and the template's deadline bound.
NAME_MAX_LENGTH = 63
MAX_ACTIVE_DEADLINE_SECONDS = 86_400
ConcurrencyPolicy = Literal["Allow", "Forbid", "Replace"]
_RUN_CONCURRENCY = ("Forbid", "Replace")
# Kruise's controller parses a schedule without timeZone in its process's local zone (formatSchedule adds `TZ=`
# only for spec.timeZone): UTC in Kruise's image unless TZ is set there. Prewarm's zone is UTC then.
ZONE_NOT_GIVEN = ("spec.timeZone is not set: the schedule runs in UTC (Kruise's controller would run it in its own "
                  "local time zone); set spec.timeZone (an IANA zone, e.g. Europe/Berlin) to run at local hours")
_NOT_RUN_HERE = ("Prewarm runs only spec.template.imageListPullJobTemplate; a {field} (pods) is for "
                 "OpenKruise's controller")


class RunTemplateMetadata(WithLabels):
    """`spec.template.imageListPullJobTemplate.metadata`: the labels and annotations of each run."""

    name: Any = Field(default=None, exclude=True)  # Kruise's controller names runs itself
    namespace: Any = Field(default=None, exclude=True)  # runs live in the cron job's namespace


def kruise_template_defaults(spec: dict[str, Any]) -> dict[str, Any]:
    """Kruise's defaulting webhook on the template's spec: with no `completionPolicy.type`, the type is
    Always and pullPolicy (600 s, 3 retries) and imagePullPolicy (IfNotPresent) are filled in; with a type
    given, nothing is."""
    result = copy.deepcopy(spec)
    completion = result.get("completionPolicy")
    completion = dict(completion) if isinstance(completion, dict) else {}
    if not completion.get("type"):
        completion["type"] = "Always"
        pull = result.get("pullPolicy")
        pull = dict(pull) if isinstance(pull, dict) else {}
        pull.setdefault("timeoutSeconds", PullPolicy().timeout_seconds)
        pull.setdefault("backoffLimit", PullPolicy().backoff_limit)
        result["pullPolicy"] = pull
        result.setdefault("imagePullPolicy", "IfNotPresent")
    result["completionPolicy"] = completion
    return result


def _kruise_template_problems(spec: dict[str, Any]) -> list[tuple[str, str]]:
    """Kruise's webhook on a defaulted template spec: Always only, a deadline within a day and (when a pull
    timeout is set) at least that timeout, no ttlSecondsAfterFinished (the history limits keep runs)."""
    completion = spec.get("completionPolicy") or {}
    kind = completion.get("type")
    if kind != "Always":
        return [(".completionPolicy.type", f"completionPolicy should be Always, but current value is: {kind}")]
    deadline = completion.get("activeDeadlineSeconds")
    timeout = (spec.get("pullPolicy") or {}).get("timeoutSeconds")
    if isinstance(deadline, int) and not isinstance(deadline, bool):
        if deadline > MAX_ACTIVE_DEADLINE_SECONDS:
            return [(".completionPolicy.activeDeadlineSeconds",
                     f"activeDeadlineSeconds must be less than {MAX_ACTIVE_DEADLINE_SECONDS}, current value is: "
                     f"{deadline}")]
        if isinstance(timeout, int) and timeout > deadline:
            return [(".completionPolicy.activeDeadlineSeconds",
                     "completionPolicy.activeDeadlineSeconds must be greater than "
                     f"pullPolicy.timeoutSeconds({timeout})")]
    if completion.get("ttlSecondsAfterFinished") is not None:
        return [(".completionPolicy.ttlSecondsAfterFinished",
                 "ttlSecondsAfterFinished is not supported in advancedCronJob: successfulJobsHistoryLimit and "
                 "failedJobsHistoryLimit keep finished runs")]
    return []


def run_spec(spec: dict[str, Any]) -> dict[str, Any]:
    """The spec a run is created with: the defaulted template's, and, when the template sets a deadline but no
    pull timeout (Kruise accepts a deadline below the 600 s default then), a timeout of that deadline, so no
    pull outlasts its run."""
    result = copy.deepcopy(spec)
    deadline = (result.get("completionPolicy") or {}).get("activeDeadlineSeconds")
    pull = dict(result.get("pullPolicy") or {})
    if isinstance(deadline, int) and "timeoutSeconds" not in pull and deadline < PullPolicy().timeout_seconds:
        pull["timeoutSeconds"] = deadline
        result["pullPolicy"] = pull
    return result


class ImageListPullJobTemplate(KubernetesModel):
    """`spec.template.imageListPullJobTemplate`: the ImageListPullJob each run is."""

    metadata: RunTemplateMetadata = Field(default_factory=RunTemplateMetadata)
    spec: ImageListPullJobSpec

    @model_validator(mode="before")
    @classmethod
    def _as_kruise_defaults_and_checks_it(cls, value: Any) -> Any:
        if not isinstance(value, dict) or not isinstance(value.get("spec"), dict):
            return value
        spec = kruise_template_defaults(value["spec"])
        raise_problems([(f".spec{path}", message) for path, message in _kruise_template_problems(spec)])
        return {**value, "spec": run_spec(spec)}


class CronJobTemplate(KubernetesModel):
    """`spec.template`: exactly one template; Prewarm runs the image list one."""

    image_list_pull_job_template: ImageListPullJobTemplate | None = None
    job_template: Any = Field(default=None, exclude=True)
    broadcast_job_template: Any = Field(default=None, exclude=True)

    @model_validator(mode="after")
    def _one_image_list_template(self) -> CronJobTemplate:
        given = [name for name, value in (("jobTemplate", self.job_template),
                                          ("broadcastJobTemplate", self.broadcast_job_template),
                                          ("imageListPullJobTemplate", self.image_list_pull_job_template))
                 if value is not None]
        if len(given) > 1:
            raise_problems([("", "spec can have only one template, either JobTemplate or BroadcastJobTemplate or "
                                 "ImageListPullJobTemplate should be provided")])
        if not given:
            raise_problems([("", "spec must have one template: Prewarm runs imageListPullJobTemplate")])
        if given[0] != "imageListPullJobTemplate":
            raise_problems([(f".{given[0]}", _NOT_RUN_HERE.format(field=given[0]))])
        return self


class AdvancedCronJobSpec(KubernetesModel):
    """`spec` of an AdvancedCronJob, with Kruise's defaults for an image list template."""

    schedule: str
    time_zone: str | None = None
    starting_deadline_seconds: int | None = Field(default=None, ge=0)
    concurrency_policy: ConcurrencyPolicy = "Replace"  # concurrent pulls of the same list gain nothing
    paused: bool = False
    successful_jobs_history_limit: int = Field(default=3, ge=0, le=INT32_MAX)
    failed_jobs_history_limit: int = Field(default=1, ge=0, le=INT32_MAX)
    template: CronJobTemplate

    @field_validator("concurrency_policy", "paused", "successful_jobs_history_limit", "failed_jobs_history_limit",
                     mode="before")
    @classmethod
    def _null_is_default(cls, value: Any, info: Any) -> Any:
        if value is None or value == "":
            return cls.model_fields[info.field_name].default
        return value

    @field_validator("schedule")
    @classmethod
    def _schedule_parses(cls, schedule: str) -> str:
        if not schedule:
            raise ValueError("schedule cannot be empty, please provide valid cron schedule.")
        try:
            CronSchedule.parse(schedule).scheduler_expressions()
        except CronScheduleError as e:
            raise ValueError(f"invalid cron schedule: {e}") from None
        return schedule

    @field_validator("time_zone")
    @classmethod
    def _time_zone_is_known(cls, zone: str | None) -> str | None:
        if zone is not None and (problem := time_zone_problem(zone)):
            raise ValueError(f"timeZone {problem}")
        return zone

    @model_validator(mode="after")
    def _fields_agree(self) -> AdvancedCronJobSpec:
        problems: list[tuple[str, str]] = []
        if "TZ" in self.schedule and self.time_zone is not None:
            problems.append((".schedule", "cannot use both timeZone field and TZ or CRON_TZ in schedule"))
        if self.concurrency_policy not in _RUN_CONCURRENCY:
            problems.append((".concurrencyPolicy", f"concurrencyPolicy should be Replace or Forbid, but current "
                                                   f"value is: {self.concurrency_policy}"))
        raise_problems(problems)
        return self

    @property
    def cron(self) -> CronSchedule:
        return CronSchedule.parse(self.schedule)

    @property
    def zone(self) -> str:
        """The schedule's time zone: `timeZone`, a `TZ=` prefix, else UTC (Kruise's default is its
        controller's zone; Lambda's is UTC)."""
        return self.time_zone or self.cron.time_zone or "UTC"

    @property
    def zone_given(self) -> bool:
        return self.time_zone is not None or self.cron.time_zone is not None

    def next_run(self, now: float) -> float | None:
        """When the next run is due after `now` (epoch seconds), in the schedule's zone; None while paused. An
        `@every` schedule's is counted from `now`: Scheduler counts its rate from when the schedule was put."""
        return None if self.paused else self.cron.next_after(now, self.zone)


class AdvancedCronJobMeta(NamespacedObjectMeta):
    """`metadata`, with the name rules of Kruise's webhook on top of Kubernetes'."""

    @field_validator("name")
    @classmethod
    def _kruise_name(cls, name: str) -> str:
        if len(name) > NAME_MAX_LENGTH:
            raise ValueError(f"must be no more than {NAME_MAX_LENGTH} characters")
        if "." in name:
            raise ValueError("AdvancedCronJob name must consist of alphanumeric characters or '-'")
        return name


class AdvancedCronJob(NamespacedManifest):
    """An OpenKruise AdvancedCronJob whose runs are ImageListPullJobs."""

    api_version: Literal["apps.kruise.io/v1beta1", "prewarm.dev/v1alpha1"]
    kind: Literal["AdvancedCronJob"]
    metadata: AdvancedCronJobMeta
    spec: AdvancedCronJobSpec

    @property
    def template(self) -> ImageListPullJobTemplate:
        template = self.spec.template.image_list_pull_job_template
        assert template is not None  # the model refuses a cron job without it
        return template

    def to_manifest(self) -> dict[str, Any]:
        doc = super().to_manifest()
        doc["metadata"] = {"name": self.name, "namespace": self.namespace, **doc["metadata"]}
        return doc

    def spec_hash(self) -> str:
        """SHA-256 of the canonical JSON of the spec, defaults filled in."""
        return hash_spec(self.spec)

    def warnings(self) -> list[str]:
        """What applying it should tell the user though it is valid: a schedule with no time zone."""
        return [] if self.spec.zone_given else [ZONE_NOT_GIVEN]

    def run_name(self, scheduled_at: float) -> str:
        """Kruise's run name: `<name>-<scheduled time, Unix seconds>`."""
        return f"{self.name}-{int(scheduled_at)}"

    def run_object(self, scheduled_at: float, uid: str, owner_uid: str = "") -> dict[str, Any]:
        """The run as the object Kruise's controller creates for a cron job in the cluster (`uid` its object's):
        an ImageListPullJob that the cron job controls (`controller`, `blockOwnerDeletion`), so that the
        garbage collector deletes it with the cron job. `owner_uid`: as `run`'s."""
        doc = self.run(scheduled_at, owner_uid).to_manifest()
        doc["metadata"]["ownerReferences"] = [{"apiVersion": self.api_version, "kind": "AdvancedCronJob",
                                               "name": self.name, "uid": uid, "controller": True,
                                               "blockOwnerDeletion": True}]
        return doc

    def run(self, scheduled_at: float, owner_uid: str = "") -> ImageListPullJob:
        """The ImageListPullJob of the run scheduled at `scheduled_at`, in the cron job's namespace; `owner_uid`:
        the uid of the cron job's item, which the run names."""
        template = self.template
        annotations = {**(template.metadata.annotations or {}), SCHEDULED_AT_ANNOTATION: format_time(scheduled_at),
                       CRON_JOB_ANNOTATION: self.name, **({CRON_JOB_UID_ANNOTATION: owner_uid} if owner_uid else {})}
        metadata: dict[str, Any] = {"name": self.run_name(scheduled_at), "namespace": self.namespace,
                                    "annotations": annotations}
        if template.metadata.labels:
            metadata["labels"] = dict(template.metadata.labels)
        api_version = KRUISE_CRON_API_VERSION if self.api_version == KRUISE_CRON_API_VERSION else PREWARM_API_VERSION
        return ImageListPullJob.from_manifest({
            "apiVersion": api_version, "kind": "ImageListPullJob", "metadata": metadata,
            "spec": template.spec.model_dump(by_alias=True, mode="json", exclude_none=True)})


def orphaned_runs(namespace: str, name: str, objs: Iterable[Mapping[str, Any]]) -> set[str]:
    """The names of the run objects of cron job `namespace/name` among `objs` that outlived it: annotated
    as its runs and controlled by no AdvancedCronJob. `kubectl delete --cascade=orphan` leaves them so (the
    garbage collector takes the owner reference off each, and deletes none); they stay, and keep running.

    >>> run = {"metadata": {"name": "n-1", "namespace": "ns", "annotations": {CRON_JOB_ANNOTATION: "n"}}}
    >>> owned = {"metadata": {**run["metadata"], "name": "n-2", "ownerReferences": [
    ...     {"kind": "AdvancedCronJob", "name": "n", "controller": True}]}}
    >>> sorted(orphaned_runs("ns", "n", [run, owned]))
    ['n-1']
    """
    found = set()
    for obj in objs:
        meta = obj.get("metadata") or {}
        if (meta.get("namespace") == namespace and (meta.get("annotations") or {}).get(CRON_JOB_ANNOTATION) == name
                and cron_job_owning(obj) is None):
            found.add(str(meta.get("name", "")))
    return found


def cron_job_owning(obj: Mapping[str, Any]) -> str | None:
    """The AdvancedCronJob that controls object `obj` (its controller ownerReference), or None."""
    for ref in (obj.get("metadata") or {}).get("ownerReferences") or []:
        if isinstance(ref, Mapping) and ref.get("kind") == "AdvancedCronJob" and ref.get("controller") is True:
            return str(ref.get("name", ""))
    return None


@dataclass(frozen=True)
class StoredCronJob:
    """A cron job item: the manifest as applied (Kruise's defaults filled in) under its key."""

    key: JobKey
    manifest: dict[str, Any] = field(hash=False)
    spec_hash: str = ""
    # Made when the item is first written, kept while it is applied again: this cron job's, not its name's.
    uid: str = ""

    @cached_property
    def job(self) -> AdvancedCronJob:
        return AdvancedCronJob.from_manifest(self.manifest)


@dataclass(frozen=True)
class ScheduleState:
    """One of a cron job's EventBridge Scheduler schedules as Scheduler holds it (GetSchedule)."""

    name: str
    expression: str
    zone: str
    enabled: bool


def schedule_drift(spec: AdvancedCronJobSpec, found: Sequence[ScheduleState]) -> str:
    """How the schedules on AWS differ from what the spec puts (`services.cron_jobs.sync_schedules`), or ""."""
    wanted = spec.cron.scheduler_expressions()
    if not found:
        return "no schedule on AWS: dispatch_job has not put it (see its DLQ)"
    problems = []
    if sorted(s.expression for s in found) != sorted(wanted):
        problems.append(f"expressions {', '.join(s.expression for s in found)}, spec: {', '.join(wanted)}")
    if zones := sorted({s.zone for s in found} - {spec.zone}):
        problems.append(f"time zone {', '.join(zones)}, spec: {spec.zone}")
    if any(s.enabled == spec.paused for s in found):
        problems.append("enabled while paused" if spec.paused else "disabled though not paused")
    return "; ".join(problems)


# --- The runs ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class CronRun:
    """A run as the rules need it: its name, scheduled time, start, and outcome (None while active)."""

    name: str
    scheduled_at: float | None
    start_time: float | None = None
    succeeded: bool | None = None

    @property
    def is_active(self) -> bool:
        return self.succeeded is None


def run_outcome(completion_time: object, succeeded: int, desired: int) -> bool | None:
    """Kruise's reading of a run: active until it has a completionTime, then succeeded when every image
    did (`succeeded == desired`), failed otherwise."""
    if completion_time is None:
        return None
    return succeeded == desired


@dataclass(frozen=True)
class RunPlan:
    """What to do for a due run: create it (after deleting `replace`), or skip it and say why."""

    create: bool
    replace: tuple[str, ...] = ()
    reason: str = ""


def plan_run(spec: AdvancedCronJobSpec, *, scheduled_at: float, now: float, runs: Sequence[CronRun]) -> RunPlan:
    """Whether the run scheduled at `scheduled_at` starts `now`, as Kruise's controller decides: not while
    paused, not past `startingDeadlineSeconds`, not while another runs under Forbid; under Replace the
    active runs are deleted first, under Allow they are left running."""
    if spec.paused:
        return RunPlan(False, reason="paused")
    deadline = spec.starting_deadline_seconds
    if deadline is not None and scheduled_at + deadline < now:
        return RunPlan(False, reason=f"missed its starting deadline ({deadline} s after {format_time(scheduled_at)})")
    active = tuple(run.name for run in runs if run.is_active and run.scheduled_at != scheduled_at)
    if spec.concurrency_policy == "Forbid" and active:
        return RunPlan(False, reason=f"concurrencyPolicy Forbid: {', '.join(active)} still running")
    if spec.concurrency_policy == "Replace":
        return RunPlan(True, replace=active)
    return RunPlan(True)


def _oldest_first(runs: Iterable[CronRun]) -> list[CronRun]:
    # Kruise sorts by startTime, a run without one first.
    return sorted(runs, key=lambda run: (run.start_time is not None, run.start_time or 0.0, run.name))


def expired_runs(spec: AdvancedCronJobSpec, runs: Sequence[CronRun]) -> list[str]:
    """The finished runs beyond `successfulJobsHistoryLimit` and `failedJobsHistoryLimit`, oldest first."""
    expired: list[str] = []
    for outcome, limit in ((True, spec.successful_jobs_history_limit), (False, spec.failed_jobs_history_limit)):
        finished = _oldest_first(run for run in runs if run.succeeded is outcome)
        expired += [run.name for run in finished[:max(0, len(finished) - limit)]]
    return expired


def cron_status(runs: Sequence[CronRun], namespace: str, api_version: str = PREWARM_API_VERSION) -> dict[str, Any]:
    """Kruise's status: `type`, the `active` runs as object references, `lastScheduleTime` (the latest
    scheduled time of any run)."""
    status: dict[str, Any] = {"type": "ImageListPullJob"}
    active = [{"apiVersion": api_version, "kind": "ImageListPullJob", "name": run.name, "namespace": namespace}
              for run in sorted(runs, key=lambda run: run.name) if run.is_active]
    if active:
        status["active"] = active
    times = [run.scheduled_at for run in runs if run.scheduled_at is not None]
    if times:
        status["lastScheduleTime"] = format_time(max(times))
    return status
