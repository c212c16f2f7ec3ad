"""Clusters: the EKS clusters one stack serves, how a job or a node names its cluster, and which clusters a
rule selects.

The stack's own cluster (`ClusterName`) is the default cluster, written `""`: its jobs, nodes and queues
keep the names they had before clusters were registered, so a one-cluster stack changes nothing. Every
other cluster is registered (`prewarm cluster add`), and its name scopes whatever would otherwise repeat
across clusters: job keys (`<cluster>:<namespace>/<name>`), registered nodes (`<cluster>:<node>`) and
node queues. Node names repeat across clusters (EKS names nodes after their private IPs); neither
namespaces nor node names can hold `:`, so a scoped name is never read two ways.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from enum import StrEnum
from typing import Any, ClassVar

from prewarm.domain.kubernetes import NamesOrLabelSelector, label_map_problems
from prewarm.domain.push import REGION
from prewarm.domain.registry_budget import MAX_SEND_DELAY_SECONDS

DEFAULT_CLUSTER = ""
SEPARATOR = ":"
# EKS CreateCluster: "The name can contain only alphanumeric characters (case-sensitive), hyphens, and
# underscores. It must start with an alphanumeric character and can't be longer than 100 characters."
CLUSTER_NAME_MAX = 100
_CLUSTER_NAME = re.compile(r"[0-9A-Za-z][A-Za-z0-9_-]*")
CLUSTER_NAME_PATTERN = f"^{_CLUSTER_NAME.pattern}$"


class ClusterError(ValueError):
    """A cluster EKS or Kubernetes would not accept: its name, or its labels."""


def cluster_name_problem(name: str) -> str | None:
    """Why `name` is not an EKS cluster name, or None."""
    if not name:
        return "must not be empty"
    if len(name) > CLUSTER_NAME_MAX:
        return f"must be no more than {CLUSTER_NAME_MAX} characters"
    if not _CLUSTER_NAME.fullmatch(name):
        return ("must start with a letter or digit and contain only letters, digits, '-' and '_' "
                f"(regex used for validation is '{_CLUSTER_NAME.pattern}')")
    return None


def check_cluster_name(name: str) -> str:
    if problem := cluster_name_problem(name):
        raise ClusterError(f"invalid cluster name {name!r}: {problem}")
    return name


def scoped(cluster: str, local: str) -> str:
    """`local` (a job's `namespace/name`, a node's name) as the stack names it: prefixed with its cluster
    unless that is the default one.

    >>> scoped("", "ml/web"), scoped("prod-eu", "ml/web")
    ('ml/web', 'prod-eu:ml/web')
    """
    return f"{cluster}{SEPARATOR}{local}" if cluster else local


def split_scoped(text: str) -> tuple[str, str]:
    """(cluster, local) of a scoped name; the cluster is `""` for the default one.

    >>> split_scoped("prod-eu:ml/web"), split_scoped("ml/web")
    (('prod-eu', 'ml/web'), ('', 'ml/web'))
    """
    cluster, separator, local = text.partition(SEPARATOR)
    return (cluster, local) if separator else (DEFAULT_CLUSTER, text)


def shown(cluster: str, default_name: str) -> str:
    """How a cluster is shown to people: the default one under the stack's `ClusterName`."""
    return cluster or default_name


class ClusterSetup(StrEnum):
    """How far `prewarm cluster add` got with a registered cluster. It is recorded before anything is
    installed, so its agents' first hellos are accepted; it is served (jobs, sweep, hellos) in every state."""

    INSTALLING = "Installing"  # recorded; the reachability check and the install under way, or interrupted
    FAILED = "Failed"  # the check refused it or the install failed: `setup_message` says why
    INSTALLED = "Installed"  # also every cluster recorded before setups were (it was recorded after its install)


@dataclass(frozen=True)
class RegisteredCluster:
    """A cluster the stack serves: where its API is and what it is labelled with, how far its `cluster add`
    got (`setup`, `setup_message`), and how it last answered (`reachable`, `reason`, `checked_at`, `agents`:
    written by the schedules that call it)."""

    name: str
    endpoint: str = ""
    ca_data: str = ""
    labels: Mapping[str, str] = field(default_factory=dict)
    added_at: float | None = None
    reachable: bool | None = None
    reason: str = ""
    checked_at: float | None = None
    agents: int | None = None
    last_sync: float | None = None
    setup: ClusterSetup = ClusterSetup.INSTALLED
    setup_message: str = ""
    # The AWS Region the cluster runs in ("": the stack's own), which says whose ECR replica its nodes pull.
    region: str = ""

    def __post_init__(self) -> None:
        if self.name:
            check_cluster_name(self.name)
        if self.region and not REGION.fullmatch(self.region):
            raise ClusterError(f"cluster {self.name or '(default)'}: region {self.region!r} is not an AWS Region "
                               "name such as \"us-east-1\"")
        if problems := label_map_problems(dict(self.labels)):
            raise ClusterError(f"cluster {self.name or '(default)'}: " + "; ".join(
                f"labels{where}: {problem}" for where, problem in problems))

    @property
    def is_default(self) -> bool:
        return self.name == DEFAULT_CLUSTER


class ClusterSelector(NamesOrLabelSelector):
    """A rule's `spec.clusters`: cluster `names`, or a label selector over registered clusters (not both).
    Absent, a rule selects every cluster the stack serves."""

    noun: ClassVar[str] = "cluster name"

    @classmethod
    def name_problem(cls, name: str) -> str | None:
        return cluster_name_problem(name)

    def select(self, clusters: Iterable[RegisteredCluster], default_name: str) -> list[RegisteredCluster]:
        """The clusters this selects, in the order given. The default cluster answers to the stack's
        `ClusterName` (`default_name`) and carries no labels of its own unless registered with some."""
        if self.names is not None:
            wanted = set(self.names)
            return [c for c in clusters if shown(c.name, default_name) in wanted]
        return [c for c in clusters if self.matches(c.labels)]

    def unknown_names(self, clusters: Iterable[RegisteredCluster], default_name: str) -> list[str]:
        """The names this selector gives that none of `clusters` answers to (a rule's typo, or a cluster
        not registered yet): its pushes make no job there."""
        known = {shown(c.name, default_name) for c in clusters}
        return [name for name in self.names or () if name not in known]


# The install applies a ValidatingAdmissionPolicy (admissionregistration.k8s.io/v1), GA and served by
# default from Kubernetes 1.30 (KEP-3488); an older API server refuses it.
MIN_KUBERNETES = (1, 30)
_VERSION = re.compile(r"v?(\d+)\.(\d+)")


def kubernetes_version(info: Mapping[str, Any]) -> tuple[int, int] | None:
    """(major, minor) of an API server's `/version` answer: its `gitVersion` (`v1.30.4-eks-a737599`), else
    `major` and `minor` (EKS reports `"30+"`); None when neither reads as a version.

    >>> kubernetes_version({"gitVersion": "v1.29.8-eks-a737599"}), kubernetes_version({"major": "1", "minor": "31+"})
    ((1, 29), (1, 31))
    """
    found = _VERSION.match(str(info.get("gitVersion") or ""))
    if found is None:
        found = _VERSION.fullmatch(f"{info.get('major', '')}.{str(info.get('minor', '')).rstrip('+')}")
    return None if found is None else (int(found.group(1)), int(found.group(2)))


@dataclass(frozen=True)
class ClusterReach:
    """How cluster `cluster`'s API answered a GET of `/version` from the stack's own network: the version it
    reported (`version`: its `gitVersion`, or `major.minor`), or why it could not be reached (`error`;
    `unauthorized`: the API did not accept the function's token, as before its access entry applies)."""

    cluster: str
    version: str = ""
    error: str = ""
    unauthorized: bool = False

    @classmethod
    def of_version(cls, cluster: str, info: Mapping[str, Any]) -> ClusterReach:
        parsed = kubernetes_version(info)
        shown_as = str(info.get("gitVersion") or "") or (f"{parsed[0]}.{parsed[1]}" if parsed else "")
        return cls(cluster, version=shown_as or repr(dict(info))[:80])

    def problem(self) -> str | None:
        """Why Prewarm cannot be installed in the cluster, one line naming what was found; None when it can."""
        who = f"cluster {self.cluster}"
        if self.error:
            return f"{who} cannot be reached from the stack's network: {self.error}"
        found = kubernetes_version({"gitVersion": self.version})
        if found is None:
            return f"{who} answered /version with no Kubernetes version Prewarm can read ({self.version})"
        if found < MIN_KUBERNETES:
            least = ".".join(map(str, MIN_KUBERNETES))
            return (f"{who} runs Kubernetes {self.version}, older than {least}: the ValidatingAdmissionPolicy the "
                    f"install applies is GA from {least}; upgrade the cluster")
        return None

    def to_json(self) -> dict[str, Any]:
        return {"cluster": self.cluster, "version": self.version, "error": self.error,
                **({"unauthorized": True} if self.unauthorized else {})}

    @classmethod
    def from_json(cls, doc: Any) -> ClusterReach:
        """What the function answered; `ValueError` naming what is missing when it is not an answer."""
        if not isinstance(doc, Mapping) or not isinstance(doc.get("cluster"), str) or not (
                doc.get("version") or doc.get("error")):
            raise ValueError(f"not a reachability answer (cluster, and version or error): {str(doc)[:200]}")
        return cls(str(doc["cluster"]), str(doc.get("version") or ""), str(doc.get("error") or ""),
                   unauthorized=doc.get("unauthorized") is True)


def select_clusters(selector: ClusterSelector | None, clusters: Sequence[RegisteredCluster], default_name: str
                    ) -> list[RegisteredCluster]:
    """Every cluster when a rule names none, else those its selector selects."""
    return list(clusters) if selector is None else selector.select(clusters, default_name)


def resolve_cluster(name: str | None, default_name: str) -> str:
    """A cluster named by a person (`--cluster`, a rule) as the stack keys it: `""` for the default one,
    whether named by its `ClusterName` or not at all."""
    if not name or name == default_name:
        return DEFAULT_CLUSTER
    return check_cluster_name(name)


# A cluster whose API just failed is skipped this long by the calls that must not wait on it (the status
# path), doubling while it keeps failing, up to the most; a server's Retry-After is honoured within the most.
CIRCUIT_OPEN_SECONDS = 10.0
CIRCUIT_OPEN_MOST_SECONDS = 120.0

# A parked job's cluster is probed this often until it answers (`ClusterProbe`, sent with this SQS delay):
# the circuit's shortest spell, so a probe keeps the pace of the circuit's first trial, never faster.
PROBE_SECONDS = 10
# A probe chain whose next probe is this long overdue is taken as lost (its send failed, its message was
# dropped after its receives): the next park or sweep starts another. A late message of the old chain then
# names a token no longer the cluster's, and does nothing.
PROBE_LOST_SECONDS = 60


def probe_chain_runs(due: float | None, now: float) -> bool:
    """Whether a cluster's probe chain runs: its next probe (due at `due`, None: no chain) is not lost.
    While it runs, the cluster failed a call within the last probe's spell, and the chain asks for the plans
    of the jobs parked on it as soon as it answers, so a plan parks at once rather than calling it again.

    >>> probe_chain_runs(None, 100.0), probe_chain_runs(110.0, 100.0), probe_chain_runs(100.0 - 61, 100.0)
    (False, True, False)
    """
    return due is not None and due >= now - PROBE_LOST_SECONDS


def probe_delay(seconds: float = PROBE_SECONDS) -> int:
    """The SQS delay of the next probe: `seconds` rounded up, at least `PROBE_SECONDS`, at most SQS's 900."""
    return int(min(MAX_SEND_DELAY_SECONDS, max(PROBE_SECONDS, -(-seconds // 1))))


@dataclass(frozen=True)
class ClusterCircuit:
    """A circuit breaker's rule for one cluster's API: closed (calls go) until a call fails; then open, calls
    skipped until `retry_at`; then one call is let through (`trial`): its answer closes the circuit, its
    failure opens it again for twice as long.

    >>> c = ClusterCircuit().failed(100.0, "connection refused")
    >>> c.allows(105.0), c.allows(110.0), c.trial(110.0).allows(111.0), c.answered().allows(105.0)
    (False, True, False, True)
    """

    failures: int = 0
    retry_at: float = 0.0
    reason: str = ""
    # When a probe may call though the circuit is still open: `CIRCUIT_OPEN_SECONDS` after the last failure,
    # or after the server's Retry-After.
    probe_at: float = 0.0

    @property
    def is_open(self) -> bool:
        return self.failures > 0

    def allows(self, now: float) -> bool:
        """Whether a call may be made at `now`."""
        return not self.is_open or now >= self.retry_at

    def allows_probe(self, now: float) -> bool:
        """Whether a probe may call at `now`: one call that asks whether the API is back, for jobs parked on it.
        It keeps the circuit's first pace (never sooner than `CIRCUIT_OPEN_SECONDS` after a failure, nor
        before a Retry-After) while the other calls' spells double, so a return is seen within a probe's
        period, not a doubled spell's.

        >>> c = ClusterCircuit().failed(0.0, "refused").failed(10.0, "refused").failed(30.0, "refused")
        >>> c.allows(45.0), c.allows_probe(39.0), c.allows_probe(40.0)
        (False, False, True)
        """
        return not self.is_open or now >= min(self.retry_at, self.probe_at)

    def open_seconds(self, failures: int) -> float:
        return min(CIRCUIT_OPEN_MOST_SECONDS, CIRCUIT_OPEN_SECONDS * (1 << max(0, failures - 1)))

    def failed(self, now: float, reason: str, retry_after: float | None = None) -> ClusterCircuit:
        """After a call failed (the API unreachable, throttling, a 5xx, access refused)."""
        failures = self.failures + 1
        wait = self.open_seconds(failures)
        probe = CIRCUIT_OPEN_SECONDS
        if retry_after is not None:
            wait = max(wait, min(retry_after, CIRCUIT_OPEN_MOST_SECONDS))
            probe = max(probe, min(retry_after, CIRCUIT_OPEN_MOST_SECONDS))
        return ClusterCircuit(failures, now + wait, reason, now + probe)

    def trial(self, now: float) -> ClusterCircuit:
        """A call let through once the circuit's time is up: the next one waits for its answer (or as long
        again)."""
        return self if not self.is_open else ClusterCircuit(self.failures, now + self.open_seconds(self.failures),
                                                            self.reason, now + CIRCUIT_OPEN_SECONDS)

    def probe_trial(self, now: float) -> ClusterCircuit:
        """A probe let through while the circuit is open: the next probe waits as long again; the other calls'
        spell is left as it is."""
        return self if not self.is_open else replace(self, probe_at=now + CIRCUIT_OPEN_SECONDS)

    def answered(self) -> ClusterCircuit:
        """After a call was answered (whatever the answer: a 404 is an answer)."""
        return ClusterCircuit()

    def skipped(self, now: float) -> str:
        """Why a call is not made at `now`: how the last one failed, and for how long more none is made."""
        return f"{self.reason}; not called again for {max(0.0, self.retry_at - now):.0f} s"
