"""Only the control plane makes node queues, each with the stack's policy and tags: a hello whose node its
cluster's API shows makes its node's queue, or sets a queue found there back to the stack's; a hello the
API does not vouch for makes none (its agent waits and says hello again). The sweep sets back any queue of
the stack whose policy is not the stack's, such as one naming the roles of a stack since recreated."""

from __future__ import annotations

import json

import pytest

from prewarm.domain.messages import Hello, PullTask
from prewarm.domain.node_queues import attribute_drift, foreign_principals
from prewarm.domain.nodes import RegisteredNode
from prewarm.services.budget import TimeBudget
from prewarm.services.jobs import apply_manifest
from prewarm.services.node_queues import REPAIR_SLOTS, due_this_run, repair_queues
from prewarm.services.reports import register_node
from prewarm.services.schedules import SweepSettings, sweep
from tests.support.cluster import make_node
from tests.support.cluster_directory import clusters_of
from tests.support.control_plane import ControlPlane, memory_plane
from tests.support.manifests import job_doc
from tests.support.memory_queues import MemoryTaskQueues

SENDERS = ["arn:aws:iam::123456789012:role/stack-DispatchJobRole", "arn:aws:iam::123456789012:role/stack-SweepRole"]
# What IAM leaves in a queue policy when the role it named is deleted: the role's unique id.
OLD_STACK_POLICY = json.dumps({"Version": "2012-10-17", "Statement": [
    {"Sid": "OnlyPrewarmSends", "Effect": "Allow", "Principal": {"AWS": ["AROAOLDDISPATCHROLE0"]},
     "Action": "sqs:SendMessage", "Resource": "*"},
    {"Sid": "NobodyElseSends", "Effect": "Deny", "Principal": "*", "Action": "sqs:SendMessage", "Resource": "*",
     "Condition": {"ArnNotEquals": {"aws:PrincipalArn": ["arn:aws:iam::123456789012:role/old-DispatchJobRole"]}}}]})
# A compromised node's: it lets the agents' role send, so it could feed the node any task.
AGENT_OWNED_POLICY = json.dumps({"Version": "2012-10-17", "Statement": [
    {"Effect": "Allow", "Principal": {"AWS": "arn:aws:iam::123456789012:role/prewarm-agent"},
     "Action": "sqs:*", "Resource": "*"}]})


@pytest.fixture
def plane() -> ControlPlane:
    """A control plane whose node queues carry the stack's senders' policy."""
    plane = memory_plane()
    q = plane.queues
    assert isinstance(q, MemoryTaskQueues)
    plane.queues = MemoryTaskQueues(q.prefix, f"{q.base_url}/prewarm-status", dlq_arn=q.dlq_arn, sqs=plane.sqs,
                                    sender_arns=SENDERS)
    return plane


def hello(plane: ControlPlane, node: str, *, shown: bool = True) -> None:
    register_node(plane.store, plane.queues, plane.cluster if shown else None,
                  Hello(node=node, architecture="amd64", queue_url=plane.queues.queue_url(node)), now=plane.now())


def stacks(plane: ControlPlane, node: str) -> bool:
    """Whether the node's queue exists with exactly the stack's attributes and tags."""
    queue = plane.sqs.queue(plane.queues.queue_url(node))
    q = plane.queues
    assert isinstance(q, MemoryTaskQueues)
    return queue is not None and attribute_drift(queue.attributes, q._attributes()) == {} and (
        plane.queues.queue_node(plane.queues.queue_url(node)) == node)


def test_a_hello_the_clusters_api_vouches_for_makes_the_nodes_queue_with_the_stacks_policy(
        plane: ControlPlane) -> None:
    # Given a node of the cluster whose agent started: it has no queue (no agent may make one)
    plane.cluster.nodes.append(make_node("a"))
    assert plane.queues.find_queue("a") is None
    # When its hello arrives
    hello(plane, "a")
    # Then the control plane made its queue: the stack's policy (only the stack's senders), DLQ and tags
    assert stacks(plane, "a")
    queue = plane.sqs.queue(plane.queues.queue_url("a"))
    assert foreign_principals(queue.attributes["Policy"], SENDERS) == []
    assert json.loads(queue.attributes["RedrivePolicy"])["deadLetterTargetArn"] == plane.queues.dlq_arn


def test_a_hello_the_api_does_not_vouch_for_registers_the_node_but_makes_no_queue(plane: ControlPlane) -> None:
    # Given a hello naming a node the cluster does not have (a forged one), and one whose API is unreachable
    plane.cluster.nodes.append(make_node("b"))
    hello(plane, "not-a-node")
    hello(plane, "b", shown=False)
    # Then neither makes a queue: no one can have a queue made for a node of their choosing
    assert plane.queues.list_node_queues() == {}
    # ... and a later hello the API vouches for does (the waiting agent says hello again)
    hello(plane, "b")
    assert stacks(plane, "b")


@pytest.mark.parametrize("policy", [OLD_STACK_POLICY, AGENT_OWNED_POLICY], ids=["old-stack-roles", "foreign"])
def test_a_queue_made_by_someone_else_before_the_nodes_hello_is_set_back_by_the_hello(
        plane: ControlPlane, policy: str) -> None:
    # Given a node's queue made before its agent's hello with another policy and none of the stack's tags
    plane.cluster.nodes.append(make_node("c"))
    plane.sqs.create_queue(plane.queues.queue_name("c"), {"owner": "someone"}, {"Policy": policy,
                                                                                "DelaySeconds": "900"})
    # When the node's hello arrives
    hello(plane, "c")
    # Then the queue is the stack's again: its policy, its attributes, its tags
    assert stacks(plane, "c")


def test_tasks_sent_before_a_queue_was_made_again_reach_it_with_the_hello(plane: ControlPlane) -> None:
    # Given a registered node whose queue went (deleted by hand) while a task was dispatched to it
    plane.cluster.nodes.append(make_node("d"))
    hello(plane, "d")
    plane.sqs.delete_queue(plane.queues.queue_url("d"))
    plane.sqs.clock = lambda: 1e12  # SQS allows the name again
    plane.agentless = {"d"}
    apply_manifest(plane.store, job_doc(parallelism=1), now=plane.now())
    plane.plan("warm")
    assert plane.node_messages("d") == []
    # When the waiting agent says hello again
    hello(plane, "d")
    # Then the queue is made and the task dispatched meanwhile is sent to it
    assert [type(m) for m in plane.node_messages("d")] == [PullTask]


def test_the_sweep_sets_back_queues_whose_policy_names_a_recreated_stacks_old_roles(plane: ControlPlane) -> None:
    # Given registered nodes whose queues a stack since deleted made: their policy names its old roles
    for name in ("e", "f"):
        plane.cluster.nodes.append(make_node(name))
        hello(plane, name)
        plane.sqs.queue(plane.queues.queue_url(name)).attributes["Policy"] = OLD_STACK_POLICY
        plane.store.put_node(RegisteredNode(name=name, labels={}, architecture="amd64", os="linux",
                                            queue_url=plane.queues.queue_url(name), last_hello=plane.now()))
    # When the sweep has run ten times (each queue is checked once in ten runs)
    repaired: dict[str, tuple[str, ...]] = {}
    for minute in range(REPAIR_SLOTS):
        result = sweep(plane.store, plane.queues, clusters_of(plane.store, plane.cluster), now=60.0 * minute,
                       config=SweepSettings(prefix="pw"))
        repaired.update(result.queues_repaired)
    # Then each was set back to the stack's policy, once
    assert repaired == {plane.queues.queue_name("e"): ("Policy",), plane.queues.queue_name("f"): ("Policy",)}
    assert stacks(plane, "e") and stacks(plane, "f")


def test_the_sweeps_check_reads_each_queue_once_in_ten_runs_and_only_while_it_has_time(plane: ControlPlane) -> None:
    names = {f"pw-n{i}": f"url-{i}" for i in range(200)}
    runs = [{n for n in names if due_this_run(n, run)} for run in range(REPAIR_SLOTS)]
    assert set().union(*runs) == set(names) and sum(map(len, runs)) == len(names)
    assert all(len(r) < 40 for r in runs)
    out = repair_queues(plane.queues, names, run=0, budget=TimeBudget(lambda: 0.0))
    assert (out.checked, out.repaired) == (0, {})
