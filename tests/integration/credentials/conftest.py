"""moto for the credentials integration tests, as for the unit tests."""

from collections.abc import Iterator

import pytest

from tests.support.aws import mocked_aws
from tests.support.credentials import REGION


@pytest.fixture
def aws(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    with mocked_aws(monkeypatch, REGION):
        yield
