"""Shared pytest configuration. Fixture plugins for the local servers are registered here."""

pytest_plugins: list[str] = [
    "prewarm_devtools.pytest_plugins.aws_limits",
    "prewarm_devtools.pytest_plugins.node",
    "prewarm_devtools.pytest_plugins.kubeapi",
    "tests.security.secret_guard",
    "tests.support.lambda_stack",
]
