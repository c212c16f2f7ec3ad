"""Whether a node's agent is there and talking: judged when a job is viewed and by the sweep.

An agent sends a `Pulling` report for each task it holds at least every `REPORT_INTERVAL_SECONDS`
while the pull runs, between attempts and while a retry waits for a pull slot. A node `Pulling` with
no report for `SILENT_AFTER_INTERVALS` intervals therefore has an agent that is gone (or cut off from
the status queue); a node with no hello ever received has no agent at all. Both are computed from the
stored node item and the registered nodes, at the time of viewing: nothing is written to show them.
"""

from __future__ import annotations

from collections.abc import Container

# Re-exported: the intervals belong with the rules that judge silence by them.
from prewarm.domain.intervals import AGENT_SILENCE_SECONDS as AGENT_SILENCE_SECONDS
from prewarm.domain.intervals import NO_AGENT_GRACE_SECONDS as NO_AGENT_GRACE_SECONDS
from prewarm.domain.intervals import REPORT_INTERVAL_SECONDS as REPORT_INTERVAL_SECONDS
from prewarm.domain.intervals import SILENT_AFTER_INTERVALS as SILENT_AFTER_INTERVALS
from prewarm.domain.intervals import SILENT_AFTER_SECONDS as SILENT_AFTER_SECONDS
from prewarm.domain.messages import NodePhase
from prewarm.domain.status import NodeTaskRecord

AGENT_NOT_REPORTING = "agent not reporting"
NO_AGENT_ON_NODE = "no agent on node"


def silence(task: NodeTaskRecord, *, now: float) -> float | None:
    """Seconds since the node's agent last reported on this task; None when it never has."""
    if task.phase is NodePhase.WAITING or task.updated_at is None:
        return None
    return max(0.0, now - task.updated_at)


def is_silent(task: NodeTaskRecord, *, now: float) -> bool:
    """A `Pulling` node whose agent sent nothing for `SILENT_AFTER_INTERVALS` report intervals."""
    quiet = silence(task, now=now)
    return task.phase is NodePhase.PULLING and quiet is not None and quiet > SILENT_AFTER_SECONDS


def node_problem(task: NodeTaskRecord, *, now: float, agents: Container[str] | None) -> str | None:
    """What keeps an unfinished node from progressing, as a person reads it; None when nothing does.

    `agents` holds the nodes whose agent said hello (None: not known, so not judged). A node that has
    reported on the task has an agent, registered or not.
    """
    if task.phase is NodePhase.WAITING and agents is not None and task.node not in agents:
        return NO_AGENT_ON_NODE
    if is_silent(task, now=now):
        return AGENT_NOT_REPORTING
    return None
