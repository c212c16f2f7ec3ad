"""moto for the credentials integration tests: the same `aws` fixture as the unit tests."""

from tests.unit.credentials.conftest import aws

__all__ = ["aws"]
