"""moto in-process, for fixtures that need AWS without a network."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import pytest
from moto import mock_aws


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
    with mock_aws():
        yield
