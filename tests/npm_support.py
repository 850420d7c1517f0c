"""The official MCP servers from the npm registry, as the tests start them over stdio.

``.ci/run`` installs them with ``npm ci --prefix tests/npm`` (the versions are pinned in
``tests/npm/package.json`` and its lock file). Without them, tests that need them skip on a
developer's machine and fail under CI (``CI`` set), where they must be there.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

NPM_BIN = Path(__file__).resolve().with_name("npm") / "node_modules" / ".bin"
FILESYSTEM = NPM_BIN / "mcp-server-filesystem"
EVERYTHING = NPM_BIN / "mcp-server-everything"


def npm_server(path: Path) -> str:
    """The command that starts an official server: skipped where it is not installed, failed
    under CI."""
    if not path.exists():
        message = f"{path.name} is not installed: npm ci --prefix tests/npm"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    return str(path)
