"""What the `prewarm` CLI prints: kubectl-style tables and documents, `describe` text and the watch display.

Tables are plain columns three spaces apart, as kubectl prints them: no truncation, no trailing
blanks, so they read well and pipe into `awk`. rich draws only the live watch progress, and is
imported only then.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Callable, Container, Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, TextIO

from prewarm.domain.boot import CONDITION_TYPE
from prewarm.domain.boot import current as current_condition
from prewarm.domain.jobs import ImageListPullJob, ImagePullJob
from prewarm.domain.liveness import node_problem, silence
from prewarm.domain.manifests import parse_manifest

if TYPE_CHECKING:
    from prewarm.domain.job import StoredJob
    from prewarm.domain.nodes import RegisteredNode
    from prewarm.domain.status import NodeTaskRecord
    from prewarm.services.jobs import JobView

NONE = "<none>"
UNKNOWN = "<unknown>"
_GAP = "   "
_LISTED_IMAGES = 3
# describe lists this many failed or excluded nodes and counts the rest.
LISTED = 20


# --- Units ---------------------------------------------------------------------------------------


def human_age(seconds: float) -> str:
    """An age the way kubectl prints it: `45s`, `3m20s`, `5h`, `2d3h`, `400d`, `2y10d`."""
    if seconds < -1:
        return "<invalid>"
    s = max(int(seconds), 0)
    minutes, hours, days = s // 60, s // 3600, s // 86400
    if s < 120:
        return f"{s}s"
    if minutes < 10:
        return f"{minutes}m{s % 60}s" if s % 60 else f"{minutes}m"
    if minutes < 180:
        return f"{minutes}m"
    if hours < 8:
        return f"{hours}h{minutes % 60}m" if minutes % 60 else f"{hours}h"
    if hours < 48:
        return f"{hours}h"
    if hours < 24 * 8:
        return f"{days}d{hours % 24}h" if hours % 24 else f"{days}d"
    if days < 365 * 2:
        return f"{days}d"
    years = days // 365
    if years < 8:
        return f"{years}y{days % 365}d" if days % 365 else f"{years}y"
    return f"{years}y"


def human_duration(seconds: float) -> str:
    """A pull's duration: tenths below ten seconds (`1.4s`), else as `human_age`."""
    return f"{max(seconds, 0.0):.1f}s" if seconds < 10 else human_age(seconds)


def human_bytes(count: int | float) -> str:
    """Binary units as docker and kubectl print sizes: `512 B`, `12.3 MiB`."""
    if abs(count) < 1024:
        return f"{int(count)} B"
    value = float(count)
    for unit in ("KiB", "MiB", "GiB"):
        value /= 1024
        if abs(value) < 1024:
            return f"{value:.1f} {unit}"
    return f"{value / 1024:.1f} TiB"


def rfc3339(epoch: float | None) -> str | None:
    """Kubernetes' timestamp form, whole seconds in UTC: `2024-05-01T12:00:00Z`."""
    if epoch is None:
        return None
    return datetime.fromtimestamp(int(epoch), UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _age(epoch: float | None, now: float) -> str:
    return UNKNOWN if epoch is None else human_age(now - epoch)


def _when(epoch: float | None, now: float) -> str:
    return NONE if epoch is None else f"{rfc3339(epoch)} ({human_age(now - epoch)} ago)"


# --- Tables --------------------------------------------------------------------------------------


def table(headers: Sequence[str], rows: Iterable[Sequence[object]], *, indent: str = "") -> str:
    """Columns three spaces apart, left-aligned, the last one unpadded (kubectl's printer)."""
    cells = [[str(h) for h in headers], *[["" if c is None else str(c) for c in row] for row in rows]]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    lines = []
    for row in cells:
        padded = [cell.ljust(widths[i]) for i, cell in enumerate(row[:-1])] + [row[-1]]
        lines.append((indent + _GAP.join(padded)).rstrip())
    return "\n".join(lines)


def _images(record: StoredJob) -> str:
    if not record.is_list_job:
        return record.image
    images = record.images
    shown = ",".join(images[:_LISTED_IMAGES])
    return shown + (f" +{len(images) - _LISTED_IMAGES} more" if len(images) > _LISTED_IMAGES else "")


def jobs_table(views: Sequence[JobView], *, now: float, wide: bool = False, all_namespaces: bool = False,
               cluster_names: Callable[[str], str] | None = None) -> str:
    """Kruise's ImagePullJob columns and where the job comes from: NAME TOTAL ACTIVE SUCCEED FAILED AGE SOURCE
    MESSAGE (+ IMAGE PARALLELISM ROUND). SOURCE: resource (a prewarm.dev resource in the cluster), cli or rule.
    With `cluster_names` (how each cluster is shown), a CLUSTER column first: the stack serves several."""

    headers = ["NAME", "TOTAL", "ACTIVE", "SUCCEED", "FAILED", "AGE", "SOURCE", "MESSAGE"]
    if wide:
        headers += ["IMAGE", "PARALLELISM", "ROUND"]
    if all_namespaces:
        headers.insert(0, "NAMESPACE")
    rows = []
    for v in views:
        r = v.record
        row: list[object] = [r.name, v.desired, v.active, v.succeeded, v.failed, _age(r.created_at, now),
                             r.source, v.message + silent_note(v.silent_agents)]
        if wide:
            row += [_images(r), r.parallelism, "-" if r.is_list_job else r.round]
        if all_namespaces:
            row.insert(0, r.namespace)
        if cluster_names is not None:
            row.insert(0, cluster_names(r.cluster))
        rows.append(row)
    if cluster_names is not None:
        headers.insert(0, "CLUSTER")
    return table(headers, rows)


def _selector_text(selector: Any) -> str:
    if selector is None:
        return NONE
    if getattr(selector, "names", None):
        return "names " + ", ".join(selector.names)
    return str(selector.to_query()) or "<everything>"


def _spec_model(manifest: dict[str, Any]) -> ImagePullJob | ImageListPullJob:
    job = parse_manifest(manifest)
    if not isinstance(job, ImagePullJob | ImageListPullJob):
        raise TypeError(f"{manifest.get('kind')} is not a job")
    return job


def rules_table(rules: Sequence[dict[str, Any]]) -> str:
    """NAME REPOSITORIES TAGS NAMESPACE AGE; the store keeps no creation time of rules, so AGE is unknown."""
    rows = []
    for rule in rules:
        spec = rule.get("spec", {})
        namespace = spec.get("template", {}).get("metadata", {}).get("namespace", "default")
        rows.append([
            rule.get("metadata", {}).get("name", ""), ",".join(spec.get("repositories", [])),
            ",".join(spec.get("tags", ["*"])), namespace, UNKNOWN,
        ])
    return table(["NAME", "REPOSITORIES", "TAGS", "NAMESPACE", "AGE"], rows)


def cron_jobs_table(docs: Sequence[dict[str, Any]]) -> str:
    """NAMESPACE NAME SCHEDULE TIMEZONE PAUSED ACTIVE LASTSCHEDULETIME: Kruise's columns and what runs now."""
    rows = []
    for doc in docs:
        spec, status, meta = doc.get("spec", {}), doc.get("status", {}), doc.get("metadata", {})
        rows.append([meta.get("namespace", ""), meta.get("name", ""), spec.get("schedule", ""),
                     spec.get("timeZone") or "UTC", str(bool(spec.get("paused"))).lower(),
                     str(len(status.get("active", []))), status.get("lastScheduleTime") or NONE])
    return table(["NAMESPACE", "NAME", "SCHEDULE", "TIMEZONE", "PAUSED", "ACTIVE", "LASTSCHEDULETIME"], rows)


def labels_text(labels: dict[str, str]) -> str:
    return ",".join(f"{k}={v}" for k, v in sorted(labels.items())) or NONE


def _warm_lines(node: RegisteredNode, *, now: float) -> tuple[str, list[str]]:
    """The startup taint's state, and the details under it."""
    warm = node.warm
    if warm is None:
        if node.warm_until is None:
            return f"{NONE} (the node joined without it, or its agent predates it)", []
        left = node.warm_until - now
        return (f"held until its images are present, at the latest {human_age(left)} from now" if left > 0
                else "held past its deadline: the agent has not said it came off"), []
    state = ("warm: every required image was present" if warm.outcome == "warm"
             else "removed at maxWarmSeconds with images missing")
    lines = _fields([
        ("Joined", _when(warm.joined_at, now)),
        ("Hello", f"{_when(warm.hello_at, now)}, {human_age(max(0.0, warm.hello_at - warm.joined_at))} after join"),
        ("Untainted", _when(warm.warm_at, now)),
        ("Hello To Warm", human_age(warm.hello_to_warm)),
        ("Join To Warm", human_age(warm.join_to_warm)),
    ], indent="  ")
    if warm.missing:
        more = warm.missing_total - len(warm.missing)
        lines.append(f"  Missing ({warm.missing_total}):")
        lines += [f"    {image}" for image in warm.missing]
        if more > 0:
            lines.append(f"    ... and {more} more (the node's PrewarmWarmTimeout Event names them all)")
    return state, lines


def describe_node(node: RegisteredNode, *, now: float, bytes_pulled: int) -> str:
    """`prewarm describe node`: what its agent said in its hello, and how the node warmed."""
    state, details = _warm_lines(node, now=now)
    lines = _fields([
        ("Name", node.name), ("Architecture", node.architecture or UNKNOWN), ("OS", node.os or UNKNOWN),
        ("Labels", labels_text(node.labels)), ("Queue", node.queue_url or NONE),
        ("Last Hello", _when(node.last_hello, now)), ("Startup Taint", state),
    ])
    return "\n".join(lines + details + _boot_lines(node, bytes_pulled) + _footprint_lines(node, now))


def _footprint_lines(node: RegisteredNode, now: float) -> list[str]:
    """What Prewarm's images weigh on the node and what their removals freed, as its agent last said."""
    footprint = node.footprint
    if footprint is None:
        return _fields([("Prewarm Footprint", "none reported (nothing pulled by Prewarm, or an agent too old)")])
    return _fields([
        ("Prewarm Footprint", f"{footprint.bytes:,} bytes in {footprint.images} images pulled by Prewarm "
                              f"(as of {_when(footprint.at, now)})"),
        ("Bytes Freed", f"{footprint.freed_bytes:,} (images Prewarm removed once no job wanted them)"),
    ])


def _boot_lines(node: RegisteredNode, bytes_pulled: int) -> list[str]:
    """Which required images were present at boot, what its pulls downloaded, and the `PrewarmWarm`
    condition record_status set."""
    boot, condition = node.boot, current_condition(node)
    lines = []
    if boot is not None:
        lines += _fields([("Present At Boot", f"{len(boot.present)} of {len(boot.required)} required images")])
        lines += [f"  {image}" for image in boot.present]
    lines += _fields([("Bytes Pulled", f"{bytes_pulled:,} (its pulls for the running Never jobs)")])
    if condition is not None:
        lines += _fields([(CONDITION_TYPE, f"{condition.status} ({condition.reason}): {condition.message}")])
    return lines


# --- Documents (-o yaml|json|name) ---------------------------------------------------------------


# The annotation `get -o yaml|json` names each job's cluster with (namesake jobs in two clusters).
CLUSTER_ANNOTATION = "prewarm.dev/cluster"


def job_document(view: JobView, cluster: str) -> dict[str, Any]:
    """The job as `kubectl get -o yaml` shows it: the applied manifest, server metadata (`cluster`, as
    people name it, in the `prewarm.dev/cluster` annotation) and status."""
    r = view.record
    doc: dict[str, Any] = copy.deepcopy(r.manifest)
    metadata = doc.setdefault("metadata", {})
    metadata.update({"name": r.name, "namespace": r.namespace, "uid": r.uid, "generation": r.generation})
    metadata["annotations"] = {**(metadata.get("annotations") or {}), CLUSTER_ANNOTATION: cluster}
    if r.created_at is not None:
        metadata["creationTimestamp"] = rfc3339(r.created_at)
    from prewarm.services.jobs import kruise_status

    status = kruise_status(view)
    doc["status"] = status.to_dict()
    return doc


def rule_document(rule: dict[str, Any]) -> dict[str, Any]:
    doc: dict[str, Any] = copy.deepcopy(rule)
    return doc


def object_name(doc: dict[str, Any]) -> str:
    """`-o name`: `imagepulljob.apps.kruise.io/job-x`, as kubectl prints it."""
    kind, api_version = doc.get("kind", ""), doc.get("apiVersion", "")
    group = api_version.split("/")[0] if "/" in api_version else ""
    if kind in ("ImagePullJob", "ImageListPullJob"):
        group = "apps.kruise.io"  # prewarm.dev/v1alpha1 jobs are Kruise jobs under another name
    return f"{kind.lower()}.{group}/{doc.get('metadata', {}).get('name', '')}" if group else f"{kind.lower()}/"


def render_documents(docs: list[dict[str, Any]], output: str, *, single: bool) -> str:
    """yaml, json or name output; several objects (or a listing) become a `kind: List`, as kubectl does."""
    if output == "name":
        return "\n".join(object_name(d) for d in docs)
    body: dict[str, Any] = docs[0] if single else {"apiVersion": "v1", "kind": "List", "items": docs}
    if output == "json":
        return json.dumps(body, indent=4)
    import yaml

    return yaml.safe_dump(body, sort_keys=False, default_flow_style=False, allow_unicode=True).rstrip("\n")


# --- describe ------------------------------------------------------------------------------------


def _fields(pairs: Sequence[tuple[str, object]], indent: str = "") -> list[str]:
    width = max(len(k) for k, _ in pairs) + 2
    return [f"{indent}{(k + ':').ljust(width)}{v}".rstrip() for k, v in pairs]


def _seconds(value: object) -> str:
    return NONE if value is None else f"{value}s"


def _progress(task: NodeTaskRecord) -> str:
    if task.bytes_total:
        done = task.bytes_done or 0
        return f"{human_bytes(done)}/{human_bytes(task.bytes_total)} ({100 * done // task.bytes_total}%)"
    return human_bytes(task.bytes_done) if task.bytes_done else "-"


def _duration(task: NodeTaskRecord, now: float) -> str:
    if task.started_at is None:
        return "-"
    return human_duration((task.finished_at or now) - task.started_at)


NODE_COLUMNS = ("NODE", "PHASE", "SENT", "REPORTED", "ATTEMPTS", "PROGRESS", "DURATION", "MESSAGE")


def _reported(task: NodeTaskRecord, now: float) -> str:
    quiet = silence(task, now=now)
    return "-" if quiet is None else f"{human_age(quiet)} ago"


def _message(task: NodeTaskRecord, now: float, agents: Container[str] | None) -> str:
    problem = node_problem(task, now=now, agents=agents)
    if problem is None:
        return task.message or ""
    return f"{problem}; {task.message}" if task.message else problem


def node_rows(
    tasks: Sequence[NodeTaskRecord], *, now: float, agents: Container[str] | None = None
) -> list[list[object]]:
    """One row per node, like a NodeImage's status: phase, when the task was sent (a Waiting node with a
    task sent holds a parallelism slot), how long ago the node last reported, attempts, bytes pulled,
    duration, message. The message starts with `agent not reporting` or `no agent on node` (`agents`: the
    nodes whose agent said hello) when that is what holds the node up, judged now.
    """
    return [
        [t.node, t.phase.value, "-" if t.dispatched_at is None else f"{human_age(now - t.dispatched_at)} ago",
         _reported(t, now), t.attempt, _progress(t), _duration(t, now), _message(t, now, agents)]
        for t in tasks
    ]


def describe_job(view: JobView, *, now: float) -> str:
    """`prewarm describe job`: spec summary, status, per-node table and excluded nodes (or the children)."""
    r = view.record
    job = _spec_model(r.manifest)
    spec = job.spec
    meta = job.metadata
    lines = _fields([
        ("Name", r.name), ("Namespace", r.namespace), *([("Cluster", r.cluster)] if r.cluster else []),
        ("Kind", r.api_kind), ("API Version", job.api_version),
        ("UID", r.uid), ("Created", _when(r.created_at, now)), ("Labels", labels_text(meta.labels or {})),
        ("Annotations", labels_text(meta.annotations or {})),
    ])
    if r.owner:
        lines += _fields([("Owner", f"ImageListPullJob {r.owner}")])
    completion = spec.completion_policy
    policy: str = completion.type
    if completion.active_deadline_seconds is not None:
        policy += f", activeDeadlineSeconds {completion.active_deadline_seconds}"
    if completion.ttl_seconds_after_finished is not None:
        policy += f", ttlSecondsAfterFinished {completion.ttl_seconds_after_finished}"
    sandbox = spec.sandbox_config
    image_pairs: list[tuple[str, object]] = (
        [("Image", job.spec.image)] if isinstance(job, ImagePullJob) else [("Images", ", ".join(job.spec.images))]
    )
    lines.append("Spec:")
    lines += _fields([
        *image_pairs,
        ("Selector", _selector_text(spec.selector)),
        ("Pod Selector", _selector_text(spec.pod_selector)),
        ("Parallelism", spec.parallelism),
        ("Pull Policy", f"timeoutSeconds {spec.pull_policy.timeout_seconds}, "
                        f"backoffLimit {spec.pull_policy.backoff_limit}"),
        ("Image Pull Policy", spec.image_pull_policy),
        ("Completion Policy", policy),
        ("Pull Secrets", (", ".join(spec.pull_secrets or []) or NONE) + (" only" if spec.pull_secrets_only else "")),
        ("Sandbox Config", labels_text({**(sandbox.labels or {}), **(sandbox.annotations or {})}) if sandbox else NONE),
    ], "  ")
    lines.append("Status:")
    status_pairs: list[tuple[str, object]] = [("State", r.state), ("Generation", r.generation)]
    if r.is_pull_job:
        status_pairs.append(("Round", r.round))
    status_pairs += [
        ("Desired", view.desired), ("Active", view.active), ("Succeeded", view.succeeded), ("Failed", view.failed),
        ("Failed Nodes", listed(view.failed_nodes) or NONE), ("Start Time", _when(r.start_time, now)),
        ("Completion Time", _when(view.completion_time, now)), ("Message", view.message),
        *_wave_pairs(view), *(_children_estimate(view) if r.is_list_job else _estimate_pairs(view)),
    ]
    lines += _fields(status_pairs, "  ")
    if r.is_list_job:
        lines += _describe_children(view, now=now)
    else:
        lines += _describe_nodes(view, now=now)
    return "\n".join(lines)


def _wave_pairs(view: JobView) -> list[tuple[str, object]]:
    """A seed wave's progress and its seed nodes; a list job's, per image."""
    if view.record.is_list_job:
        waves = "; ".join(f"{c.record.name}: {c.wave}" for c in view.children if c.wave)
        return [("Wave", waves)] if waves else []
    return [("Wave", view.wave), ("Seed Nodes", listed(sorted(view.record.seeds)))] if view.wave else []


def _children_estimate(view: JobView) -> list[tuple[str, object]]:
    """A list job's ETA: the longest of its running images' (`prewarm describe job CHILD` shows each)."""
    known = [c.estimate for c in view.children if c.estimate and c.estimate.seconds and c.completion_time is None]
    return [("ETA", max(known, key=lambda e: e.seconds or 0))] if known else []


def _estimate_pairs(view: JobView) -> list[tuple[str, object]]:
    """`ETA` while the job runs, its first estimate beside it; once it has finished, that first estimate
    against how long it took."""
    first = view.first_estimate
    if view.completion_time is not None:
        return [("Estimate at Start", first.against(view.completion_time))] if first else []
    pairs: list[tuple[str, object]] = [("ETA", view.estimate)] if view.estimate else []
    return pairs + ([("Estimate at Start", first.summary())] if first else [])


def _describe_nodes(view: JobView, *, now: float) -> list[str]:
    tasks = view.tasks
    counts: dict[str, int] = {}
    for t in tasks:
        counts[t.phase.value] = counts.get(t.phase.value, 0) + 1
    summary = ", ".join(f"{n} {phase}" for phase, n in counts.items())
    lines = [f"Nodes ({len(tasks)}{': ' + summary if summary else ''}):"]
    if tasks:
        lines.append(table(NODE_COLUMNS, node_rows(tasks, now=now, agents=view.agents), indent="  "))
    else:
        lines.append("  " + ("<none yet: the job is not planned>" if view.record.planned != view.record.plan_id
                             else NONE))
    if view.warm:
        lines.append("Startup Taint (nodes that joined with it):")
        rows = [[node, w.outcome, human_age(w.hello_to_warm), human_age(w.join_to_warm), _when(w.warm_at, now)]
                for node, w in sorted(view.warm.items())]
        lines.append(table(["NODE", "OUTCOME", "HELLO-TO-WARM", "JOIN-TO-WARM", "UNTAINTED"], rows, indent="  "))
    excluded = view.excluded
    lines.append(f"Excluded Nodes ({len(excluded)}):")
    if excluded:
        shown = excluded[:LISTED]
        lines.append(table(["NODE", "REASON"], [[e.name, e.reason] for e in shown], indent="  "))
        if len(excluded) > len(shown):
            lines.append(f"  ... and {len(excluded) - len(shown)} more (`-o yaml` on `get` lists every node)")
    else:
        lines.append(f"  {NONE}")
    return lines


def listed(names: Sequence[str]) -> str:
    """The first `LISTED` names and how many more: a fleet's failed nodes on one line a person can read."""
    shown = ", ".join(names[:LISTED])
    return f"{shown} and {len(names) - LISTED} more" if len(names) > LISTED else shown


def _describe_children(view: JobView, *, now: float) -> list[str]:
    lines = [f"ImagePullJobs ({len(view.children)}):"]
    rows = [
        [c.record.name, c.record.image, c.desired, c.active, c.succeeded, c.failed, c.message]
        for c in view.children
    ]
    if rows:
        lines.append(table(["NAME", "IMAGE", "TOTAL", "ACTIVE", "SUCCEED", "FAILED", "MESSAGE"], rows,
                           indent="  "))
        lines.append("  (`prewarm describe job NAME` shows one image's nodes)")
    else:
        lines.append(f"  {NONE}")
    from prewarm.services.jobs import list_job_status

    failed = list_job_status(view).failed_image_statuses
    if failed:
        lines.append("Failed Images:")
        lines += [f"  {f.name}: {f.message}" for f in failed]
    return lines


# --- watch ---------------------------------------------------------------------------------------


def silent_note(silent_agents: int) -> str:
    """`; 2 agents not reporting`: nodes Pulling whose agent went quiet (domain.liveness), or nothing."""
    if not silent_agents:
        return ""
    return f"; {silent_agents} agent{'s' if silent_agents > 1 else ''} not reporting"


@dataclass(frozen=True)
class WatchState:
    """What `prewarm watch` shows of a job: node counts and bytes over all its nodes."""

    desired: int
    waiting: int
    active: int
    succeeded: int
    failed: int
    bytes_done: int
    bytes_total: int
    silent_agents: int = 0
    # Nodes whose pull waits out a registry's 429 (their last report said so): not failing, held back.
    throttled: int = 0
    # `seed wave: 1/2 seeds finished` or `rest: ...` for a job with a seed wave (`WaveProgress`).
    wave: str = ""
    # `ETA 1m05s (registry budget)`: the time left and what bounds it (`prewarm.domain.eta`).
    eta: str = ""

    @property
    def done(self) -> int:
        return self.succeeded + self.failed

    def line(self) -> str:
        text = f"{self.done}/{self.desired} nodes done ({self.succeeded} succeeded, {self.failed} failed, " \
               f"{self.active} active, {self.waiting} waiting)"
        if self.bytes_total:
            text += f", {human_bytes(self.bytes_done)} of {human_bytes(self.bytes_total)}"
        if self.throttled:
            text += f"; {self.throttled} throttled by the registry"
        return text + self.notes()

    def notes(self) -> str:
        """The wave, the ETA and agents not reporting, each after a `; `."""
        return "".join(f"; {note}" for note in (self.wave, self.eta) if note) + silent_note(self.silent_agents)


class WatchDisplay:
    """A live rich progress bar on a terminal; elsewhere (pipes, CI logs) one line per change."""

    def __init__(self, title: str, *, file: TextIO | None = None, terminal: bool | None = None) -> None:
        self.title = title
        self._file = file
        self._terminal = terminal
        self._progress: Any = None
        self._tasks: dict[str, Any] = {}
        self._last: WatchState | None = None

    def __enter__(self) -> WatchDisplay:
        from rich.console import Console

        # No markup or highlighting: job names and messages are printed exactly as they are.
        console = Console(file=self._file, force_terminal=self._terminal, highlight=False, markup=False, emoji=False)
        if console.is_terminal:
            from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

            self._progress = Progress(
                TextColumn("{task.description:>6}"), BarColumn(), TextColumn("{task.fields[detail]}"),
                TimeElapsedColumn(), console=console, transient=False,
            )
            console.print(f"watching {self.title}")
            self._tasks = {
                "nodes": self._progress.add_task("nodes", total=None, detail="waiting for the plan"),
                "bytes": self._progress.add_task("bytes", total=None, detail=""),
            }
            self._progress.start()
        self._console = console
        return self

    def update(self, state: WatchState) -> None:
        if self._progress is None:
            if state != self._last:
                self._console.print(f"{self.title}: {state.line()}", soft_wrap=True)
        else:
            detail = f"{state.done}/{state.desired} ({state.succeeded} ok, {state.failed} failed, " \
                     f"{state.active} active, {state.waiting} waiting){state.notes()}"
            self._progress.update(self._tasks["nodes"], completed=state.done, total=state.desired or None,
                                  detail=detail)
            self._progress.update(
                self._tasks["bytes"], completed=state.bytes_done, total=state.bytes_total or None,
                detail=f"{human_bytes(state.bytes_done)}/{human_bytes(state.bytes_total)}" if state.bytes_total
                else "no size reported yet",
            )
        self._last = state

    def finish(self, message: str | None = None) -> None:
        """Stops the live display and prints the outcome, if any."""
        if self._progress is not None:
            self._progress.stop()
            self._progress = None
        if message is not None:
            self._console.print(message, soft_wrap=True)

    def __exit__(self, *exc: object) -> None:
        if self._progress is not None:
            self._progress.stop()
