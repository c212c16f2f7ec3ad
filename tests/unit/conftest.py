"""Unit tests run with the network off: any attempt to open a network connection fails the test."""

import socket

import pytest


class NetworkDisabledError(RuntimeError):
    """A unit test tried to reach the network."""


@pytest.fixture(autouse=True)
def _no_network(monkeypatch: pytest.MonkeyPatch) -> None:
    real_connect = socket.socket.connect

    def guarded_connect(self: socket.socket, address: object) -> None:
        if self.family == socket.AF_UNIX:
            return real_connect(self, address)
        raise NetworkDisabledError(f"unit tests run with the network off; tried to connect to {address!r}")

    monkeypatch.setattr(socket.socket, "connect", guarded_connect)
    monkeypatch.setattr(socket, "create_connection", lambda *a, **k: guarded_connect(socket.socket(), a[0]))
