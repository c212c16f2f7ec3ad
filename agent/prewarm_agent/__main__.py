"""`python -m prewarm_agent` (the `prewarm-agent` script): run the node agent until SIGTERM."""

from __future__ import annotations

import logging
import os
import sys

from prewarm.adapters.sqs import QueueError
from prewarm_agent.agent import Agent
from prewarm_agent.logs import configure_logging
from prewarm_agent.settings import AgentSettings, AgentSettingsError

log = logging.getLogger("prewarm_agent")


def main() -> int:
    """Read the settings from the environment, run the agent, and return the exit code."""
    try:
        settings = AgentSettings.from_env(os.environ)
    except AgentSettingsError as e:
        print(f"prewarm-agent: {e}", file=sys.stderr)
        return 2
    configure_logging(settings.log_level)
    agent = Agent(settings)
    try:
        return agent.run_forever()
    except QueueError as e:
        log.error("cannot start: %s", e, extra={"node": settings.node_name})
        agent.stop(0)
        return 1


if __name__ == "__main__":
    sys.exit(main())
