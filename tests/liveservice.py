"""The example web service (``examples/live_runs/app.py``), served on loopback for tests."""

from __future__ import annotations

import importlib.util
import socket
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from pathlib import Path
from types import ModuleType
from typing import Any

import anyio
import uvicorn

APP = Path(__file__).resolve().parent.parent / "examples" / "live_runs" / "app.py"


def load_example() -> ModuleType:
    """The example's module (examples/ is not a package)."""
    spec = importlib.util.spec_from_file_location("live_runs_app", APP)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def free_port() -> int:
    """A free TCP port on loopback."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@asynccontextmanager
async def serve(app: Any) -> AsyncIterator[str]:
    """Serve ``app`` with uvicorn on a free loopback port; yields the base URL."""
    port = free_port()
    server = uvicorn.Server(
        uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", lifespan="on")
    )
    async with anyio.create_task_group() as tg:
        tg.start_soon(server.serve)
        for _ in range(1000):  # uvicorn has no started event to wait on
            if server.started:
                break
            await anyio.sleep(0.02)
        else:
            raise TimeoutError("the test server did not start")
        try:
            yield f"http://127.0.0.1:{port}"
        finally:
            server.should_exit = True


def parse_sse(lines: list[str]) -> list[dict[str, str]]:
    """Server-sent event frames (``id``, ``event``, ``data``) from the lines of a stream."""
    frames: list[dict[str, str]] = []
    current: dict[str, str] = {}
    for line in lines:
        if not line:
            if current:
                frames.append(current)
            current = {}
            continue
        if line.startswith(":"):
            continue  # a comment (keepalive)
        field, _, value = line.partition(": ")
        current[field] = value
    if current:
        frames.append(current)
    return frames


def example_app(tmp_path: Path, scenarios: Mapping[str, Any] | None = None, **kw: Any) -> Any:
    """The example's app, with its runs under ``tmp_path``."""
    return load_example().create_app(tmp_path / "runs", scenarios=scenarios, **kw)
