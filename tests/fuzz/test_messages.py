"""Queue messages: status reports, hellos and warm-ups from agents, tasks and cancels to agents.

Any body is a message or a `MessageError` naming the field; any message that parses is applied by
`record_status`'s use cases without an unexpected error, and never breaks the job invariant.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from prewarm.domain.messages import (
    Hello,
    ImageGone,
    MessageError,
    StatusReport,
    Warmed,
    parse_agent_message,
    parse_node_message,
)
from prewarm.services.dispatch import plan_job
from prewarm.services.jobs import apply_manifest
from prewarm.services.reports import ReportOutcome, record_report, register_node
from prewarm.services.status_batches import record_status
from tests.fuzz.strategies import PYDANTIC_WORDING, document, json_values, maybe, mutated
from tests.reliability.invariants import assert_invariant
from tests.reliability.simulation import Plane, moto_aws
from tests.support.cluster_directory import clusters_of
from tests.support.manifests import job_doc

KEY = "default/warm"
NODES = ["n0", "n1", "n2"]

texts = st.text(max_size=40)
counts = st.integers(-3, 2**63)
ref_fields = {"v": maybe(st.just(1)), "job": maybe(st.sampled_from([KEY, "default/other", ""]) | texts),
              "job_uid": maybe(texts), "round": maybe(st.integers(-1, 3)),
              "node": maybe(st.sampled_from([*NODES, "x" * 2000, "n\x00", "ノード"]) | texts)}
status_bodies = document({
    **ref_fields, "kind": maybe(st.just("status")),
    "phase": maybe(st.sampled_from(["Pulling", "Succeeded", "Failed", "Cancelled", "Waiting", "pulling"])),
    "attempt": maybe(counts), "seq": maybe(counts), "bytes_done": maybe(counts), "bytes_total": maybe(counts),
    "image_id": maybe(texts), "repo_digest": maybe(texts), "size_bytes": maybe(counts), "message": maybe(texts),
    "started_at": maybe(st.floats()), "finished_at": maybe(st.floats()),
})
hello_bodies = document({
    "v": maybe(st.just(1)), "kind": maybe(st.just("hello")), "node": ref_fields["node"],
    "labels": maybe(st.dictionaries(texts, texts, max_size=3)), "architecture": maybe(texts), "os": maybe(texts),
    "queue_url": maybe(texts), "images": maybe(st.lists(texts, max_size=2)), "agent_version": maybe(texts),
})
stamps = maybe(st.floats() | st.integers(-5, 2**70))
warmed_bodies = document({
    "v": maybe(st.just(1)), "kind": maybe(st.just("warmed")), "node": ref_fields["node"],
    "joined_at": stamps, "hello_at": stamps, "warm_at": stamps,
    "outcome": maybe(st.sampled_from(["warm", "timeout", "cold", ""])),
    "missing": maybe(st.lists(texts | st.just("r" * 2000), max_size=25)), "missing_total": maybe(counts),
})
valid_warmed = st.fixed_dictionaries(
    {"kind": st.just("warmed"), "node": st.sampled_from([*NODES, "n9"]), "joined_at": st.floats(0, 2e9),
     "hello_at": st.floats(0, 2e9), "warm_at": st.floats(0, 2e9), "outcome": st.sampled_from(["warm", "timeout"])},
    optional={"missing": st.lists(st.text(min_size=1, max_size=40), max_size=20), "missing_total": st.integers(0, 50)})
gone_bodies = document({
    **ref_fields, "kind": maybe(st.just("gone")), "image": maybe(texts | st.just("r" * 2000)), "seen_at": stamps,
    "disk": maybe(texts),
})
valid_gone = st.fixed_dictionaries(
    {"kind": st.just("gone"), "job": st.sampled_from([KEY] * 3 + ["default/other"]),
     "job_uid": st.sampled_from(["UID"] * 3 + ["other-uid"]), "round": st.sampled_from([0] * 3 + [1]),
     "node": st.sampled_from([*NODES, "n9"]), "image": st.just("r.example/app:v1"), "seen_at": st.floats(0, 2e9)},
    optional={"disk": st.sampled_from(["", "disk guard: imagefs 91% used, threshold 85%"])})
valid_reports = st.fixed_dictionaries(
    {"v": st.just(1), "kind": st.just("status"), "job": st.sampled_from([KEY] * 5 + ["default/other"]),
     "job_uid": st.sampled_from(["UID"] * 5 + ["other-uid"]), "round": st.sampled_from([0] * 5 + [1]),
     "node": st.sampled_from([*NODES, *NODES, "n9", "new"]),
     "phase": st.sampled_from(["Pulling", "Pulling", "Succeeded", "Failed", "Cancelled"])},
    optional={"attempt": st.integers(0, 3), "seq": st.integers(0, 50), "bytes_done": st.integers(0, 100),
              "bytes_total": st.integers(0, 100), "image_id": texts, "message": texts,
              "started_at": st.floats(0, 2e9), "finished_at": st.floats(0, 2e9)})
valid_hellos = st.fixed_dictionaries(
    {"kind": st.just("hello"), "node": st.sampled_from([*NODES, "n9", "x" * 300]) | texts},
    optional={"labels": st.dictionaries(texts, texts, max_size=3), "architecture": st.sampled_from(["amd64", ""])})
node_bodies = document({
    **ref_fields, "kind": maybe(st.sampled_from(["task", "cancel"])), "image": maybe(texts),
    "image_pull_policy": maybe(st.sampled_from(["Always", "IfNotPresent", "Never"])),
    "timeout_seconds": maybe(counts), "backoff_limit": maybe(counts), "deadline": maybe(st.floats()),
    "sandbox_labels": maybe(st.dictionaries(texts, texts, max_size=2)), "pull_secret_arns": maybe(st.lists(texts)),
    "size_bytes": maybe(counts), "reason": maybe(texts),
})


def as_body(value: Any) -> st.SearchStrategy[str | bytes]:
    text = json.dumps(value, allow_nan=True)
    return st.sampled_from([text, text.encode(), text[: len(text) // 2], text.encode("utf-16")])


bodies = st.one_of(
    st.one_of(status_bodies, hello_bodies, warmed_bodies, gone_bodies, node_bodies, mutated(valid_reports),
              json_values).flatmap(as_body),
    st.binary(max_size=60), st.text(max_size=60),
    st.sampled_from(['{"v": 1, "kind": "status", "job": "\\ud800"}', "null", "[]", '"status"', "1e999", "{" * 500]),
)


def assert_names_the_field(error: MessageError) -> None:
    text = str(error)
    assert text.startswith(("invalid agent message: ", "invalid node message: ")), text
    assert ": " in text.partition("message: ")[2] and not PYDANTIC_WORDING.search(text), text


@pytest.mark.parametrize("parse", [parse_agent_message, parse_node_message], ids=["agent", "node"])
@settings(max_examples=400, deadline=None)
@given(body=bodies)
def test_any_body_is_a_message_or_a_message_error_naming_the_field(
    parse: Callable[[str | bytes], Any], body: str | bytes
) -> None:
    try:
        message = parse(body)
    except MessageError as e:
        assert_names_the_field(e)
    else:
        assert parse(message.model_dump_json()) == message


@pytest.fixture(scope="module")
def planned() -> Iterator[tuple[Plane, str]]:
    """A planned Never job (it never completes, so reports keep landing) on three nodes, two dispatched;
    a hello for a new node joins it."""
    with moto_aws() as (ddb, sqs):
        plane = Plane(ddb, sqs, "fuzz")
        plane.add_nodes(*NODES)
        apply_manifest(plane.store, job_doc(parallelism=2, completionPolicy={"type": "Never"}), now=plane.clock())
        plan_job(plane.store, plane.cluster, plane.queues, KEY, now=plane.clock())
        record = plane.real_store.get_job(KEY)
        assert record is not None
        yield plane, record.uid


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.one_of(valid_reports, valid_reports, valid_reports, mutated(valid_reports), valid_hellos,
                 mutated(valid_hellos), status_bodies, hello_bodies, valid_warmed, warmed_bodies, valid_gone,
                 gone_bodies))
def test_any_parsed_report_or_hello_is_applied_or_ignored_and_the_invariant_holds(
    planned: tuple[Plane, str], body: Any
) -> None:
    plane, uid = planned
    try:
        message = parse_agent_message(json.dumps(body, allow_nan=True).replace('"UID"', json.dumps(uid)))
    except MessageError:
        return
    if isinstance(message, StatusReport):
        outcome = record_report(plane.store, plane.queues, message, now=plane.clock())
        assert isinstance(outcome, ReportOutcome) and outcome.reason
        event("applied" if outcome.applied else "ignored")
    elif isinstance(message, ImageGone):
        # A node of the job pulls again, or is ignored; the counters never move.
        outcome = record_status(plane.store, plane.queues, clusters_of(plane.store, plane.cluster),
                                [("m", message)], now=plane.clock())
        assert outcome.retry_ids == [] and len(outcome.gone) == 1
        event(f"gone: {outcome.gone[0].action}")
    elif isinstance(message, Warmed):
        # Stored for a registered node, sent back to the queue for any other; never an error.
        outcome = record_status(plane.store, plane.queues, clusters_of(plane.store, plane.cluster),
                                [("m", message)], now=plane.clock())
        assert (outcome.warmed, outcome.retry_ids) in (([message.node], []), ([], ["m"]))
        event("warm-up stored" if outcome.warmed else "warm-up retried")
    else:
        assert isinstance(message, Hello)
        register_node(plane.store, plane.queues, plane.cluster, message, now=plane.clock())
    assert_invariant(plane.real_store, KEY)


REPORT = {"kind": "status", "job": KEY, "job_uid": "UID", "round": 0, "node": "n0", "phase": "Succeeded"}


@pytest.mark.parametrize(("field", "value"), [
    ("bytes_done", 10**40), ("seq", 2**63), ("started_at", float("nan")), ("finished_at", float("inf")),
    ("finished_at", 1e200), ("node", "n" * 254), ("job", "ns/" + "j" * 500),
])
def test_values_the_job_store_cannot_hold_are_message_errors_naming_the_field(field: str, value: Any) -> None:
    # Given a report whose field DynamoDB could not store (38 digits, finite, keys of 1 KiB at most)
    body = json.dumps({**REPORT, field: value}, allow_nan=True)
    # When it is parsed, then it is a poison message naming the field, not a failed write later
    with pytest.raises(MessageError, match=rf"status\.{field}: "):
        parse_agent_message(body)


@pytest.mark.parametrize(("labels", "named"), [
    ({"": "x"}, r"\[\]: key \"\": "), ({"pool": "gpu", "not a key!": "x"}, r"\[not a key!\]: key "),
    ({"pool": "a value, not a label's"}, r"\[pool\]: value "),
])
def test_a_hello_whose_labels_are_no_nodes_labels_is_a_message_error_naming_the_label(
        labels: dict[str, str], named: str) -> None:
    # Given a hello whose labels no API server would have let a Node carry (an empty key: moto then
    # answers the node's next ALL_NEW write with a map it cannot parse)
    body = json.dumps({"v": 1, "kind": "hello", "node": "n0", "labels": labels})
    # When it is parsed, then it is a poison message naming the label, not a stored registration
    with pytest.raises(MessageError, match=rf"hello\.labels: .*{named}"):
        parse_agent_message(body)


def test_a_timestamp_too_small_for_dynamodb_is_recorded_as_zero(planned: tuple[Plane, str]) -> None:
    # Given a report whose finish time is a denormal float (DynamoDB numbers stop at 1e-130)
    plane, uid = planned
    body = json.dumps({**REPORT, "job_uid": uid, "node": "n2", "phase": "Failed", "finished_at": 1.9e-194})
    # When it is recorded, then it is stored rounded to the microsecond
    report = parse_agent_message(body)
    assert isinstance(report, StatusReport) and report.finished_at == 0.0
    assert record_report(plane.store, plane.queues, report, now=plane.clock()).reason
    assert_invariant(plane.real_store, KEY)
