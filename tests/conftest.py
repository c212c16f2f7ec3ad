"""Shared pytest configuration. Fixture plugins for the local servers are registered here."""

import pytest

pytest_plugins: list[str] = [
    "prewarm_devtools.pytest_plugins.aws_limits",
    "prewarm_devtools.pytest_plugins.node",
    "prewarm_devtools.pytest_plugins.kubeapi",
    "tests.security.secret_guard",
    "tests.support.lambda_stack",
]

# With `--dist loadfile --no-loadscope-reorder` (make test), xdist hands out files in collection order.
# These take minutes each on two slow cores: started first, no worker is left finishing one alone while
# the other idles at the end (by path, the smoke tests came last; by test count, xdist's default, late).
LONGEST_FIRST = (
    "tests/unit/test_benchmarks_smoke.py",
    "tests/reliability/test_crash_recovery.py",
    "tests/reliability/test_burst.py",
)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    def rank(item: pytest.Item) -> int:
        path = item.nodeid.split("::", 1)[0]
        return LONGEST_FIRST.index(path) if path in LONGEST_FIRST else len(LONGEST_FIRST)

    items.sort(key=rank)  # stable: every other file keeps its place
