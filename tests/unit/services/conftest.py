"""The control plane's use cases against the shared in-memory store and queues (`tests/support/memory_*.py`,
held to the adapters by tests/unit/adapters/test_memory_store_contract.py) and an in-memory cluster.

No test here reaches AWS or its stand-in: `test_no_moto_or_boto3.py` checks that nothing a test of this
directory imports loads moto or boto3. What is about the adapters themselves is tested in tests/unit/adapters.
"""

from __future__ import annotations

import pytest

from tests.support.control_plane import ControlPlane, memory_plane


@pytest.fixture
def plane() -> ControlPlane:
    """A store and queues of their own; every call's time is a second after the last one's."""
    return memory_plane()
