"""Test-wide guards: no test reaches a real provider; async tests run on asyncio."""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Iterator
from typing import Any

import pytest

PROVIDER_VARIABLES = (
    "OPENAI_API_KEY",
    "OPENAI_BASE_URL",
    "OPENAI_ORG_ID",
    "ANTHROPIC_API_KEY",
    "ANTHROPIC_BASE_URL",
    "ANTHROPIC_AUTH_TOKEN",
)


def _loopback(address: Any) -> bool:
    if not isinstance(address, tuple):
        return True  # unix sockets
    host = address[0]
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


@pytest.fixture(autouse=True)
def _no_real_providers(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Unset provider keys and refuse every connection that leaves the machine."""
    for name in PROVIDER_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    connect = socket.socket.connect
    connect_ex = socket.socket.connect_ex

    def guarded(self: socket.socket, address: Any) -> Any:
        if not _loopback(address):
            raise ConnectionRefusedError(f"tests may only connect to loopback, not {address!r}")
        return connect(self, address)

    def guarded_ex(self: socket.socket, address: Any) -> Any:
        if not _loopback(address):
            raise ConnectionRefusedError(f"tests may only connect to loopback, not {address!r}")
        return connect_ex(self, address)

    monkeypatch.setattr(socket.socket, "connect", guarded)
    monkeypatch.setattr(socket.socket, "connect_ex", guarded_ex)
    yield


@pytest.fixture
def anyio_backend() -> str:
    """Every async test runs on asyncio (the backend hierplan's CLI uses)."""
    return "asyncio"
