"""A Redis server of the tests' own: started on a free loopback port in a temporary directory
on first use, stopped when the test session ends.

Debian's ``redis-server`` is the server (``.ci/run`` installs it). Without it, tests that need
Redis skip on a developer's machine and fail under CI (``CI`` set), where it must be there.
"""

from __future__ import annotations

import atexit
import os
import shutil
import socket
import subprocess
import tempfile
import time
import uuid
from pathlib import Path

import pytest

from hierplan.budgets.redis_ledger import RedisLedger, connect

REDIS_SERVER = shutil.which("redis-server")


class RedisServer:
    """One ``redis-server`` process on 127.0.0.1."""

    def __init__(self) -> None:
        if REDIS_SERVER is None:
            raise RuntimeError("redis-server is not installed (apt-get install redis-server)")
        self.dir = Path(tempfile.mkdtemp(prefix="hierplan-redis-"))
        self.port = free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.process = subprocess.Popen(
            [
                REDIS_SERVER,
                "--bind",
                "127.0.0.1",
                "--port",
                str(self.port),
                "--dir",
                str(self.dir),
                "--save",
                "",
                "--appendonly",
                "no",
                "--daemonize",
                "no",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 10
        client = connect(self.url)
        while True:
            try:
                client.ping()
                break
            except Exception:
                if time.monotonic() > deadline or self.process.poll() is not None:
                    self.stop()
                    raise RuntimeError("redis-server did not start") from None
                time.sleep(0.05)
        client.close()

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(5)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        shutil.rmtree(self.dir, ignore_errors=True)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


_server: RedisServer | None = None


def shared_server() -> RedisServer:
    """The session's server, started on first use."""
    global _server
    if _server is None:
        _server = RedisServer()
        atexit.register(stop_shared_server)
    return _server


def stop_shared_server() -> None:
    global _server
    if _server is not None:
        _server.stop()
        _server = None


def redis_available() -> bool:
    """Whether tests can use Redis here (under CI they must: a missing server fails them)."""
    return REDIS_SERVER is not None or bool(os.environ.get("CI"))


def require_redis() -> RedisServer:
    """The shared server, or a skip where Redis is not installed and this is not CI."""
    if not redis_available():
        pytest.skip("redis-server is not installed (apt-get install redis-server)")
    return shared_server()


def redis_ledger() -> RedisLedger:
    """A Redis ledger in a namespace of its own on the shared server."""
    return RedisLedger(shared_server().url, namespace=f"test-{uuid.uuid4().hex[:12]}")
