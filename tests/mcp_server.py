"""A small MCP server for the tests, written with the official ``mcp`` SDK.

Run over stdio: ``python tests/mcp_server.py``; over streamable HTTP:
``python tests/mcp_server.py --http PORT``. Its tools: ``add``, ``lookup``, ``slow`` (an async
sleep, to be killed during), ``whoami`` (the process id) and ``fail`` (reports a tool error).
"""

from __future__ import annotations

import os
import sys

import anyio
from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError

CAPITALS = {"france": "Paris", "japan": "Tokyo", "peru": "Lima", "chile": "Santiago"}

server = MCPServer("test-tools", log_level="WARNING")


@server.tool()
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


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--http":
        server.run("streamable-http", host="127.0.0.1", port=int(sys.argv[2]))
    else:
        server.run()
