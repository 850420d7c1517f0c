"""Batches whose goals use MCP servers: the official filesystem server, each goal its own on a
directory of its own, and ``tests/mcp_server.py`` shared by the goals of a process; a model over
the OpenAI wire format whose oracle plans real tool calls. Used by the local and the Celery
tests (``python toolset_batches.py PORT`` serves the model alone, for worker processes)."""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from wire import OracleBackend, WireServer

from hierplan.agents.prompts import PlanPrompt, StepPrompt
from hierplan.models.base import ToolCall
from hierplan.plans.plan import Plan, Step
from hierplan.simulator.oracle import Action

MODEL = "openai:gpt-5-mini"
SERVER = Path(__file__).with_name("mcp_server.py")
_GOAL = re.compile(r"^Write note (\d+) into (\S+)$")


class NotesOracle:
    """Plans ``Write note N into DIR``: write DIR/note.txt, read it back, ask the shared
    server its process id."""

    def plan(self, prompt: PlanPrompt) -> Plan | None:
        found = _GOAL.match(prompt.goal.strip())
        if found is None:
            return None
        number, where = found.groups()
        note = f"{where}/note.txt"
        return Plan(
            goal=prompt.goal,
            steps=[
                Step(id="write", title="write", instruction="write", tool="write_file",
                     args={"path": note, "content": f"note {number}"}),
                Step(id="read", title="read", instruction="read", tool="read_text_file",
                     args={"path": note}, depends_on=["write"]),
                Step(id="who", title="who", instruction="who", tool="whoami", args={}),
            ],
        )  # fmt: skip

    def act(self, prompt: StepPrompt, done: Sequence[tuple[ToolCall, str]]) -> Action | None:
        return None


def goals_file(
    path: Path, root: Path, count: int, filesystem: str, *, token_variable: str | None = None
) -> list[Path]:
    """``count`` goals, each with its own directory under ``root`` and its own filesystem
    server, all sharing one ``mcp_server.py`` per process (given ``${token_variable}`` in its
    environment, when named); the directories."""
    shared: dict[str, Any] = {"command": sys.executable, "args": [str(SERVER)], "shared": True}
    if token_variable is not None:
        shared["env"] = {"NOTES_TOKEN": f"${{{token_variable}}}"}
    lines, dirs = [], []
    for i in range(count):
        where = root / f"d{i}"
        where.mkdir(parents=True)
        dirs.append(where)
        tools: list[dict[str, Any]] = [
            {"mcp": {"command": filesystem, "args": [str(where)]}},
            {"mcp": shared},
        ]
        line = {"id": f"g{i}", "goal": f"Write note {i} into {where}", "tools": tools}
        lines.append(json.dumps(line | {"model": MODEL, "strategy": "dag"}))
    path.write_text("\n".join(lines) + "\n")
    return dirs


def model_server() -> WireServer:
    """The model: an OpenAI-compatible server answering as :class:`NotesOracle`."""
    return WireServer(OracleBackend(NotesOracle()))


if __name__ == "__main__":
    import time

    with model_server() as served:
        Path(sys.argv[1]).write_text(served.openai_base_url)
        time.sleep(float(sys.argv[2]))
