"""A process may deploy local stacks one after another (test modules, local mode started twice): each
stack's handlers must reach its own moto server, not the first one's."""

from __future__ import annotations

import pytest

from prewarm_devtools.sam.aws import MotoServer, aws_environment
from prewarm_devtools.sam.stack import LocalStack

pytestmark = pytest.mark.integration


def test_handlers_of_a_second_stack_reach_its_own_endpoint() -> None:
    # Given a stack deployed and invoked on one moto server that has since stopped
    for _ in range(2):
        with MotoServer() as aws, aws_environment(aws.url):
            stack = LocalStack(aws.url, parameters={"ClusterName": "local"}).deploy()
            # When a handler reading the table runs on each stack in turn
            result = stack.fire("repull_daily")
            # Then it answers from that stack's table (no client left bound to the stopped server)
            assert result == {"rounds_started": []}
