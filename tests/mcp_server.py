"""A small MCP server for the tests, written with the official ``mcp`` SDK.

Run over stdio: ``python tests/mcp_server.py``; over streamable HTTP:
``python tests/mcp_server.py --http PORT``, where every request must carry
``Authorization: Bearer $MCP_TEST_TOKEN`` when that variable is set (401 otherwise). Its tools:
``add``, ``lookup`` (a tool error for an unknown country), ``slow`` (an async sleep, to be
killed during), ``whoami`` (the process id), ``stock`` (an unexpected error inside the tool),
``pair`` (an object) and ``wipe`` (marked destructive).
"""

from __future__ import annotations

import os
import sys
from typing import Any

import anyio
import mcp_types
from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError

CAPITALS = {"france": "Paris", "japan": "Tokyo", "peru": "Lima", "chile": "Santiago"}

server = MCPServer("test-tools", log_level="WARNING")


@server.tool(annotations=mcp_types.ToolAnnotations(read_only_hint=True))
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


@server.tool()
def lookup(country: str) -> str:
    """The capital of a country."""
    try:
        return CAPITALS[country.lower()]
    except KeyError:
        raise ToolError(f"no capital known for {country!r}") from None


@server.tool()
async def slow(seconds: float) -> str:
    """Wait ``seconds`` seconds, then answer."""
    await anyio.sleep(seconds)
    return f"waited {seconds:g} s"


@server.tool()
def whoami() -> int:
    """The server's process id."""
    return os.getpid()


@server.tool()
def stock(item: str) -> int:
    """How many of ``item`` are in stock (fails: the warehouse is unreachable)."""
    raise RuntimeError(f"warehouse unreachable while counting {item}")


@server.tool()
def pair() -> dict[str, int]:
    """Two numbers, as an object."""
    return {"a": 1, "b": 2}


@server.tool(annotations=mcp_types.ToolAnnotations(destructive_hint=True))
def wipe(path: str) -> str:
    """Delete ``path`` (pretends to)."""
    return f"wiped {path}"


def _requiring(app: Any, token: str) -> Any:
    """``app`` behind a check of the ``Authorization`` header of every HTTP request."""

    async def guarded(scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            headers = dict(scope.get("headers") or [])
            if headers.get(b"authorization", b"").decode() != f"Bearer {token}":
                await send({"type": "http.response.start", "status": 401, "headers": []})
                await send({"type": "http.response.body", "body": b"unauthorized"})
                return
        await app(scope, receive, send)

    return guarded


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--http":
        import uvicorn

        app = server.streamable_http_app()
        token = os.environ.get("MCP_TEST_TOKEN")
        uvicorn.run(
            _requiring(app, token) if token else app,
            host="127.0.0.1",
            port=int(sys.argv[2]),
            log_level="warning",
        )
    else:
        server.run()
