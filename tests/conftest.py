"""Shared pytest configuration. Fixture plugins for the local servers are registered here."""

pytest_plugins: list[str] = [
    "prewarm_local.node.pytest_plugin",
    "prewarm_local.kubeapi.pytest_plugin",
    "tests.security.secret_guard",
]
