"""The agent's Prometheus metrics, in a registry of its own so several agents can share a process."""

from __future__ import annotations

from collections.abc import Callable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from prewarm.domain.messages import NodePhase

# Pulls take seconds to tens of minutes.
PULL_SECONDS_BUCKETS = (0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1200, 1800, 3600)
OUTCOMES = tuple(p.value for p in (NodePhase.SUCCEEDED, NodePhase.FAILED, NodePhase.CANCELLED))


class AgentMetrics:
    """Counters and gauges exposed on `/metrics`."""

    def __init__(self, in_flight: Callable[[], float], registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry(auto_describe=True)
        self.pulls = Counter(
            "prewarm_agent_pulls", "Tasks finished on this node, by outcome", ["outcome"], registry=self.registry
        )
        for outcome in OUTCOMES:
            self.pulls.labels(outcome)
        self.pull_seconds = Histogram(
            "prewarm_agent_pull_seconds", "Seconds from a task's first attempt to its outcome, by outcome",
            ["outcome"], buckets=PULL_SECONDS_BUCKETS, registry=self.registry,
        )
        self.bytes_pulled = Counter(
            "prewarm_agent_pulled_bytes", "Compressed layer bytes of images pulled", registry=self.registry
        )
        self.in_flight = Gauge(
            "prewarm_agent_pulls_in_flight", "PullImage calls running now", registry=self.registry
        )
        self.in_flight.set_function(in_flight)
        self.pull_calls = Counter(
            "prewarm_agent_pull_calls", "PullImage calls started; tasks sharing one call count once",
            registry=self.registry,
        )
        self.disk_guard_refusals = Counter(
            "prewarm_agent_disk_guard_refusals", "Pulls refused because the image filesystem was too full",
            registry=self.registry,
        )
        self.registry_throttles = Counter(
            "prewarm_agent_registry_throttles", "Pull attempts the registry refused with a 429 (retried, not counted)",
            registry=self.registry,
        )
        self.messages = Counter(
            "prewarm_agent_messages_received",
            "Node queue messages received, by kind (task, cancel, duplicate, finished, required, release, poison)",
            ["kind"], registry=self.registry,
        )
        self.reports_failed = Counter(
            "prewarm_agent_report_send_failures", "Status reports the status queue did not take",
            registry=self.registry,
        )

        self.startup_taint_removals = Counter(
            "prewarm_agent_startup_taint_removals",
            "Startup taint removed from this node: warm (every required image present) or timeout "
            "(MAX_WARM_SECONDS passed with images missing)", ["outcome"], registry=self.registry,
        )
        self.images_gone = Counter(
            "prewarm_agent_images_gone",
            "Images this agent pulled (Succeeded) that later disappeared from the node, as reported to the "
            "control plane (image garbage collection)", registry=self.registry,
        )
        self.startup_taint_seconds = Gauge(
            "prewarm_agent_startup_taint_seconds",
            "Seconds from the node's join to the removal of its startup taint (0 until removed)",
            registry=self.registry,
        )

    def sample(self, name: str, labels: dict[str, str] | None = None) -> float:
        """The current value of a sample (`prewarm_agent_pulls_total`, ...); 0 when it has none yet."""
        value = self.registry.get_sample_value(name, labels or {})
        return float(value) if value is not None else 0.0
