"""A tool written as a class, for tests of tools that check a declared schema and convert
nothing themselves (as an MCP tool does)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from hierplan.tools.base import Tool


class Declared(Tool):
    """A tool written as a class, with a schema of its own: an integer ``n``, nothing else."""

    def __init__(self, name: str = "declared") -> None:
        schema = {
            "type": "object",
            "properties": {"n": {"type": "integer"}},
            "required": ["n"],
            "additionalProperties": False,
        }
        super().__init__(name, "Takes n.", schema)

    async def invoke(self, arguments: Mapping[str, Any]) -> Any:
        return arguments["n"]
