"""``hierplan tools``: start what a goal file's ``tools`` (or ``--tools``/``--mcp``) name, list
each tool with its description, arguments and where it came from, and stop them again: a
configuration checked before a run pays for a model.

Exit status: 0 when every entry opened and no two tools share a name; 2 otherwise (bad input,
an entry that cannot be opened, reported with the last lines of a server's stderr).
"""

from __future__ import annotations

import io
import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any

import anyio
import typer
from rich.console import Console
from rich.text import Text

from hierplan.cli.options import McpOpt, ToolsOpt, fail
from hierplan.errors import HierplanError, UserInputError
from hierplan.redact import redact
from hierplan.runner.goals import load_goal_file
from hierplan.tools.base import Tool, Toolset
from hierplan.tools.config import ToolsetSpec, entries_from_flags
from hierplan.view.tree import plain, short

GoalFileOpt = Annotated[
    Path | None, typer.Option("--goal-file", help="A goal file whose tools entries to start.")
]
JsonOpt = Annotated[
    bool, typer.Option("--json", help="Print the tools as JSON, with their whole schemas.")
]


@dataclass(slots=True)
class Listed:
    """What one entry gave: its tools (each with the server it came from), or why not."""

    index: int
    entry: ToolsetSpec
    tools: list[tuple[Tool, str]] = field(default_factory=list)
    error: str | None = None


def tools_command(
    goal_file: GoalFileOpt = None,
    tools: ToolsOpt = None,
    mcp: McpOpt = None,
    json_: JsonOpt = False,
) -> None:
    """Start the toolsets a goal file (or --tools and --mcp) names, list their tools, stop them.

    Each tool is shown with its description, its arguments and the server it came from. A
    server that cannot be started is reported with the end of its stderr (exit status 2).
    """
    try:
        entries = _entries(goal_file, tools or [], mcp or [])
    except HierplanError as exc:
        fail(str(exc))
    listed = anyio.run(list_toolsets, entries, dict(os.environ))
    clashes = name_clashes(listed)
    if json_:
        typer.echo(json.dumps(_as_json(listed, clashes), indent=1))
    else:
        _print(Console(), listed, clashes)
    failed = [item for item in listed if item.error is not None]
    if failed or clashes:
        problems = [f"{item.entry.named(item.index)}: {item.error}" for item in failed]
        fail(plain("; ".join([*problems, *clashes])))


def _entries(goal_file: Path | None, tools: list[str], mcp: list[str]) -> list[ToolsetSpec]:
    found = list(load_goal_file(goal_file).tools) if goal_file is not None else []
    found += entries_from_flags(tools, mcp)
    if not found:
        raise UserInputError(
            "no toolsets to list: give --goal-file FILE (with a tools list), --tools "
            "MODULE:ATTR or --mcp SERVER"
        )
    return found


async def list_toolsets(entries: Sequence[ToolsetSpec], environ: Mapping[str, str]) -> list[Listed]:
    """Open each entry (all at once), take its tools, close it; an entry that cannot be opened
    keeps the reason (its ``${VAR}`` values hidden)."""
    listed = [Listed(index, entry) for index, entry in enumerate(entries, 1)]
    quiet = io.StringIO()

    async def one(item: Listed) -> None:
        problems = item.entry.problems(environ)
        if problems:
            item.error = "; ".join(problems)
            return
        try:
            # The servers' chatter is not shown; the end of it is, for one that fails.
            for found in item.entry.toolset(environ, errlog=quiet):
                if isinstance(found, Toolset):
                    async with found.open() as opened:
                        source = getattr(found, "name", "") or item.entry.label()
                        item.tools += [(tool, f"MCP server {source}") for tool in opened]
                else:
                    item.tools.append((found, found.source or item.entry.label()))
        except HierplanError as exc:
            item.error = item.entry.hidden(str(exc), environ)

    async with anyio.create_task_group() as group:
        for item in listed:
            group.start_soon(one, item)
    return listed


def name_clashes(listed: Sequence[Listed]) -> list[str]:
    """Two tools of one name (a run would refuse them), each naming both entries."""
    seen: dict[str, str] = {}
    clashes: list[str] = []
    for item in listed:
        for tool, _ in item.tools:
            where = item.entry.named(item.index)
            if tool.name in seen and seen[tool.name] != where:
                clashes.append(
                    f"two tools are named {tool.name!r}: one from {seen[tool.name]}, one from "
                    f"{where}; give one a tool_prefix"
                )
            seen.setdefault(tool.name, where)
    return clashes


def arguments_text(schema: Mapping[str, Any]) -> str:
    """A tool's arguments in one line: ``path: string (required), head: number``."""
    properties = schema.get("properties")
    if not isinstance(properties, Mapping) or not properties:
        return "none"
    required = set(schema.get("required") or ())
    parts = []
    for name, sub in properties.items():
        kind = sub.get("type", "any") if isinstance(sub, Mapping) else "any"
        kind = "|".join(kind) if isinstance(kind, list) else str(kind)
        parts.append(f"{name}: {kind}{' (required)' if name in required else ''}")
    return ", ".join(parts)


def _print(console: Console, listed: Sequence[Listed], clashes: Sequence[str]) -> None:
    for item in listed:
        head = Text(plain(item.entry.named(item.index)), style="bold")
        if item.error is not None:
            head.append("  cannot be used", style="bold red")
            console.print(head)
            console.print(Text(f"  {plain(item.error)}", style="red"))
            continue
        head.append(f"  {len(item.tools)} tool(s)", style="dim")
        console.print(head)
        for tool, source in item.tools:
            line = Text(f"  {plain(tool.name)}", style="bold cyan")
            line.append(f"  from {plain(source)}", style="dim")
            hint = tool.hints.label()
            if hint:
                line.append(f"  [{hint}]", style="red" if hint == "destructive" else "green")
            console.print(line)
            console.print(Text(f"      {short(tool.description, 200)}"))
            console.print(Text(f"      arguments: {arguments_text(tool.parameters)}", style="dim"))
    for clash in clashes:
        console.print(Text(clash, style="bold red"))


def _as_json(listed: Sequence[Listed], clashes: Sequence[str]) -> dict[str, Any]:
    return {
        "entries": [
            {
                "entry": item.index,
                "label": item.entry.label(),
                "error": None if item.error is None else redact(item.error),
                "tools": [
                    {
                        "name": tool.name,
                        "description": tool.description,
                        "source": redact(source),
                        "parameters": tool.parameters,
                        "read_only": tool.hints.read_only,
                        "destructive": tool.hints.destructive,
                    }
                    for tool, source in item.tools
                ],
            }
            for item in listed
        ],
        "clashes": list(clashes),
    }
