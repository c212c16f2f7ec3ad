"""moto in-process, for fixtures that need AWS without a network."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import boto3
import pytest
from moto import mock_aws

_one_request = threading.RLock()


@contextmanager
def serial_mock_aws() -> Iterator[None]:
    """moto in-process, answering one request at a time, as the limits layer makes the moto server do.

    moto has no locks, and the product calls AWS from several threads at once (a batch's progress
    writes, a batch of hellos joining several jobs): a transaction deep-copies the table while another
    thread writes it. AWS serves concurrent calls; so must the stand-in.
    """
    from moto.core.botocore_stubber import BotocoreStubber

    original = BotocoreStubber.__call__

    def one_at_a_time(stub: Any, *args: Any, **kwargs: Any) -> Any:
        with _one_request:
            return original(stub, *args, **kwargs)

    with mock_aws():
        BotocoreStubber.__call__ = one_at_a_time  # type: ignore[method-assign]
        try:
            yield
        finally:
            BotocoreStubber.__call__ = original  # type: ignore[method-assign]


@contextmanager
def mocked_aws(monkeypatch: pytest.MonkeyPatch, region: str) -> Iterator[None]:
    """moto for every client made inside, in `region` by default, with test credentials and no
    profile, session token or instance metadata of the machine's to find."""
    for name in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_SECURITY_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_DEFAULT_REGION", region)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    with serial_mock_aws():
        yield


@contextmanager
def sqs_with_status_queue(region: str = "us-west-2") -> Iterator[tuple[Any, str]]:
    """moto in-process: an SQS client with test credentials and the URL of a status queue made on it."""
    with mock_aws():
        sqs = boto3.client("sqs", region_name=region, aws_access_key_id="t", aws_secret_access_key="t")
        yield sqs, sqs.create_queue(QueueName="prewarm-status")["QueueUrl"]


class Answers:
    """A boto3 client whose `operation` calls are kept with what each answered (`answers`); every other
    call goes to the client as it is."""

    def __init__(self, client: Any, operation: str) -> None:
        self.client, self.operation = client, operation
        self.answers: list[Any] = []

    def __getattr__(self, name: str) -> Any:
        method = getattr(self.client, name)
        if name != self.operation:
            return method

        def kept(**kwargs: Any) -> Any:
            answer = method(**kwargs)
            self.answers.append(answer)
            return answer

        return kept
