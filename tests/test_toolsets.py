"""Toolsets as configuration: goal files, ``--tools``/``--mcp`` and ``hierplan tools``, with the
official MCP servers from the npm registry (``server-filesystem`` on a real directory,
``server-everything``) started over stdio by hierplan, and a model over the OpenAI wire format
whose script makes real tool calls."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest
from npm_support import EVERYTHING, FILESYSTEM, npm_server
from typer.testing import CliRunner
from wire import TEST_KEY, Reply, ScriptBackend, WireCall, WireServer

from hierplan.cli import app
from hierplan.plans.plan import Plan, Step
from hierplan.records import RunResult

MODEL = "openai:gpt-5-mini"
SERVER = Path(__file__).with_name("mcp_server.py")


@pytest.fixture(autouse=True)
def _key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", TEST_KEY)


def plan_reply(*steps: Step) -> Reply:
    return Reply(
        output=Plan(goal="g", steps=list(steps)).model_dump(mode="json", exclude_none=True)
    )


def goal_file(path: Path, tools: list[dict[str, Any]], goal: str = "Take notes") -> Path:
    path.write_text(json.dumps({"goal": goal, "model": MODEL, "strategy": "dag", "tools": tools}))
    return path


def run_cli(args: list[str]) -> Any:
    return CliRunner().invoke(app, args)


def flat(text: str) -> str:
    return " ".join(text.split())


def test_a_goal_files_official_servers_run_real_tool_calls_on_a_real_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The filesystem server writes and reads a file of a real directory, the everything
    server adds and sees a variable read from this environment; a step's allowlist holds."""
    files = tmp_path / "reports"
    files.mkdir()
    (files / "incident-1.txt").write_text("cause: disk full\n")
    monkeypatch.setenv("GREETING_FOR_SERVER", "hello from the environment")
    tools = [
        {"mcp": {"command": npm_server(FILESYSTEM), "args": [str(files)]}},
        {"mcp": {"command": npm_server(EVERYTHING), "env": {"GREETING": "${GREETING_FOR_SERVER}"}}},
    ]
    notes = files / "notes.txt"
    steps = [
        Step(id="write", title="write", instruction="write", tool="write_file",
             args={"path": str(notes), "content": "causes: disk full"}),
        Step(id="read", title="read", instruction="read", tool="read_text_file",
             args={"path": str(notes)}, depends_on=["write"]),
        Step(id="sum", title="sum", instruction="add", tool="get-sum", args={"a": 2, "b": 3}),
        Step(id="env", title="env", instruction="What greeting does the server have?",
             tools=["get-env"]),
    ]  # fmt: skip
    offered: list[list[str]] = []

    def env_step(call: WireCall) -> Reply:
        offered.append(call.tools)
        return Reply(tool_calls=[("c1", "get-env", {})])

    def answer(call: WireCall) -> Reply:
        offered.append(call.tools)
        seen = [m.content for m in call.messages if m.role == "tool"]
        return Reply(
            text="greeting: " + ("found" if "hello from the environment" in seen[0] else "?")
        )

    backend = ScriptBackend([plan_reply(*steps), env_step, answer])
    out = tmp_path / "run"
    with WireServer(backend) as server:
        args = ["run", "--goal-file", str(goal_file(tmp_path / "g.json", tools)), "--yes"]
        result = run_cli([*args, "--out", str(out), "--base-url", server.openai_base_url])
    assert result.exit_code == 0, result.output
    backend.assert_complete()
    assert offered == [["get-env"], ["get-env"]]  # the step's allowlist, of every tool
    record = RunResult.load(out / "run.json")
    nodes = {n.step_id: n for n in record.nodes()}
    assert notes.read_text() == "causes: disk full"  # on disk, for real
    # The server's structured content is the value the step passes on.
    assert json.loads(nodes["read"].output or "") == {"content": "causes: disk full"}
    assert "5" in (nodes["sum"].output or "")
    assert nodes["env"].output == "greeting: found"
    (write,) = nodes["write"].tool_calls
    assert write.error is None and write.tool == "write_file"

