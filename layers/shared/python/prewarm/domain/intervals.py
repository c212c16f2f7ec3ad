"""How often agents report and how long silence is allowed: shared by the agent, the sweep and the CLI.

Plain numbers in a module of their own: the functions' settings read them at cold start, which must not
pay for the message models that `liveness` needs.
"""

from __future__ import annotations

# The agent's PROGRESS_INTERVAL_SECONDS may be shorter, never longer: the control plane and the CLI
# judge silence by this interval.
REPORT_INTERVAL_SECONDS = 5.0
SILENT_AFTER_INTERVALS = 3
SILENT_AFTER_SECONDS = SILENT_AFTER_INTERVALS * REPORT_INTERVAL_SECONDS

# The sweep's defaults (Settings AGENT_SILENCE_SECONDS and NO_AGENT_GRACE_SECONDS, docs/template.md).
AGENT_SILENCE_SECONDS = 120
NO_AGENT_GRACE_SECONDS = 120
# The agent removes the startup taint at maxWarmSeconds; the sweep, for a node whose agent never ran
# (not scheduled, its image not pullable, crash-looping), this much later (StartupTaintGraceSeconds).
STARTUP_TAINT_GRACE_SECONDS = 60
# An image no live job wants stays on its nodes this long (ImageRemovalGraceSeconds): a job deleted by
# mistake and applied again finds its image still there.
IMAGE_REMOVAL_GRACE_SECONDS = 86_400
