"""AWS's limits in force for a whole test run (`prewarm_devtools.aws_limits`).

Register with `pytest_plugins = ["prewarm_devtools.pytest_plugins.aws_limits"]`: every moto request
of the run, `mock_aws` or a moto server, is then held to AWS's quotas, unless `PREWARM_AWS_LIMITS=off`.
A test marked `@pytest.mark.aws_quotas(partition_wcu_per_s=10, ...)` runs with those quotas instead;
the `aws_limits` fixture is the layer in force for the test (None when off), its counts fresh.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from prewarm_devtools import aws_limits as layers


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "aws_quotas(**quotas): the AWS limits layer's quotas for this test")


@pytest.fixture(scope="session", autouse=True)
def _aws_limits_for_the_run() -> Iterator[None]:
    if not layers.wanted() or layers.active() is not None:
        yield
        return
    layers.enable()
    try:
        yield
    finally:
        layers.disable()


@pytest.fixture(autouse=True)
def aws_limits(request: pytest.FixtureRequest) -> Iterator[layers.AwsLimits | None]:
    """The layer in force for this test, with the quotas of its `aws_quotas` mark; counts start at zero."""
    layer = layers.active()
    marker = request.node.get_closest_marker("aws_quotas")
    if layer is None or marker is None:
        if layer is not None:
            layer.reset()
        yield layer
        return
    with layers.limits(layers.Quotas(**marker.kwargs), clock=layer.clock) as marked:
        yield marked
