"""Local mode's event source mapping leaves a message `record_status` hands back as SQS does: hidden
until its visibility runs out, the queue's 180 s unless the function changed it. Local mode used to
make every returned message visible again after 1 s, so it never showed what a returned item costs."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from prewarm_devtools.localmode import LocalMode
from tests.support.local_functions import intercept, invoking

pytestmark = pytest.mark.integration

WARMED = ('{"v": 1, "kind": "warmed", "node": "node-without-hello", "joined_at": 1.0, "hello_at": 2.0, '
          '"warm_at": 3.0, "outcome": "warm"}')


@pytest.fixture(scope="module")
def local() -> Iterator[LocalMode]:
    with LocalMode(nodes=1, agents=False, control=False) as mode:
        yield mode


def deliveries_of(local: LocalMode, wrap: Callable[[Any], Any], monkeypatch: pytest.MonkeyPatch
                  ) -> dict[str, list[float]]:
    """Puts `wrap(handler)` in place of record_status' handler for the test; returns message id → the
    times it was delivered."""
    assert local.stack is not None
    local.stack.invoke("record_status", {"Records": []})  # its environment started, as a cold start does
    handler = invoking(local.stack, "record_status")
    seen: dict[str, list[float]] = {}

    def counting(event: dict[str, Any], context: Any) -> Any:
        for record in event["Records"]:
            seen.setdefault(record["messageId"], []).append(time.monotonic())
        return wrap(handler)(event, context)

    intercept(local.stack, "record_status", counting, monkeypatch)
    return seen


def send(local: LocalMode, body: str) -> str:
    assert local.stack is not None and local.aws is not None
    url = local.stack.physical["StatusQueue"].ref
    return str(local.aws.client("sqs").send_message(QueueUrl=url, MessageBody=body)["MessageId"])


def wait_for(condition: Callable[[], bool], timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def test_a_message_handed_back_untouched_stays_hidden_for_the_queues_visibility_timeout(
    local: LocalMode, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given a record_status that hands back every message and leaves its visibility alone
    seen = deliveries_of(local, lambda _handler: lambda event, _ctx: {
        "batchItemFailures": [{"itemIdentifier": r["messageId"]} for r in event["Records"]]}, monkeypatch)
    # When a message is delivered and handed back
    message = send(local, WARMED)
    wait_for(lambda: message in seen)
    time.sleep(3)
    # Then it is not delivered again within seconds: it waits out the queue's 180 s (local mode: 1 s before)
    assert len(seen[message]) == 1


def test_a_message_record_status_hands_back_comes_again_after_its_backoff(
    local: LocalMode, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given the real record_status, and a warm-up of a node that has not said hello (it goes back)
    seen = deliveries_of(local, lambda handler: handler, monkeypatch)
    message = send(local, WARMED)
    # When it is delivered and handed back, twice
    wait_for(lambda: len(seen.get(message, [])) >= 3, timeout=30)
    first, second, third = seen[message][:3]
    # Then it came again 2 s after its first receive and 8 s after its second (domain.retry.redelivery_seconds)
    assert 2 <= second - first < 6, second - first
    assert 8 <= third - second < 14, third - second
