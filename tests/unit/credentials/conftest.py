"""The credential refresher's fixtures: moto, and a clock at `T0`."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.support.aws import mocked_aws
from tests.support.clock import Clock
from tests.support.credentials import REGION


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def aws(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    with mocked_aws(monkeypatch, REGION):
        yield
