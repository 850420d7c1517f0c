"""Toolsets as configuration: goal files, ``--tools``/``--mcp`` and ``hierplan tools``, with the
official MCP servers from the npm registry (``server-filesystem`` on a real directory,
``server-everything``) started over stdio by hierplan, and a model over the OpenAI wire format
whose script makes real tool calls."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from npm_support import EVERYTHING, FILESYSTEM, npm_server
from redis_support import free_port
from rich.console import Console
from typer.testing import CliRunner
from wire import TEST_KEY, Reply, ScriptBackend, WireCall, WireServer

import hierplan
from hierplan import (
    Approve,
    CallbackApprover,
    GateContext,
    PolicyApprover,
    ReviewPolicy,
    RunSpec,
    ScriptedModel,
    ToolsetSpec,
    UserInputError,
    plan_response,
    text_response,
)
from hierplan.cli import app
from hierplan.plans.plan import Plan, Step
from hierplan.records import RunResult
from hierplan.review.render import review_view

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
    tools: list[dict[str, Any]] = [
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


def test_hierplan_tools_lists_each_tool_with_its_server_and_arguments(tmp_path: Path) -> None:
    tools = [{"mcp": {"command": npm_server(FILESYSTEM), "args": [str(tmp_path)], "name": "fs"}}]
    path = goal_file(tmp_path / "g.json", tools)
    shown = run_cli(["tools", "--goal-file", str(path), "--mcp", npm_server(EVERYTHING)])
    assert shown.exit_code == 0, shown.output
    text = flat(shown.output)
    assert "read_text_file from MCP server fs [read-only]" in text
    assert "write_file from MCP server fs [destructive]" in text
    assert "arguments: path: string (required)" in text
    assert "get-sum from MCP server mcp-server-everything" in text
    listed = run_cli(["tools", "--mcp", npm_server(EVERYTHING), "--json"])
    assert listed.exit_code == 0, listed.output
    (entry,) = json.loads(listed.output)["entries"]
    tool = next(t for t in entry["tools"] if t["name"] == "get-sum")
    assert tool["parameters"]["required"] == ["a", "b"] and tool["read_only"] is True


def test_hierplan_tools_reports_a_server_that_fails_with_the_end_of_its_stderr(
    tmp_path: Path,
) -> None:
    script = "import sys; sys.stderr.write('reading config\\nfatal: no such index\\n'); sys.exit(2)"
    tools = [{"mcp": {"command": sys.executable, "args": ["-c", script], "name": "broken"}}]
    shown = run_cli(["tools", "--goal-file", str(goal_file(tmp_path / "g.json", tools))])
    assert shown.exit_code == 2
    assert "cannot be used" in shown.output and "fatal: no such index" in shown.output
    assert "its stderr ends with:" in shown.output and "reading config" in shown.output


def test_hierplan_tools_never_shows_a_credential_written_into_an_entry() -> None:
    """A password in a URL, and a key among a command's arguments, are shown redacted in
    every line of the report and of the error (and the JSON), the URL still a URL."""
    secret = "hunter22-not-shown"
    url = f"http://bob:{secret}@127.0.0.1:9/mcp"
    command = f"/no/such/server --api-key sk-{secret}"
    shown = run_cli(["tools", "--mcp", url, "--mcp", command])
    assert shown.exit_code == 2
    assert secret not in shown.output and "http://REDACTED@127.0.0.1:9/mcp" in flat(shown.output)
    listed = run_cli(["tools", "--mcp", url, "--json"])
    assert listed.exit_code == 2 and secret not in listed.output


def _bad_goal_files(tmp_path: Path) -> list[tuple[str, str]]:
    """Goal files with one bad entry each (as YAML, for line numbers) and what the error says."""
    server = f"{{command: {sys.executable}, args: [{SERVER}]}}"
    (tmp_path / "notools.py").write_text("VALUE = 3\n")
    head = f"goal: Take notes\nmodel: {MODEL}\ntools:\n  - mcp: {server}\n"
    return [
        (head + "  - ssh: {host: x}\n", "line 5: tools entry 2: unknown kind 'ssh'"),
        (head + "  - python: nowhere_to_be_found:tools\n", "cannot import nowhere_to_be_found"),
        (head + "  - python: notools:VALUE\n", "python notools:VALUE is not a toolset (int)"),
        (head + f"  - mcp: {server}\n", "two tools are named 'add': one from goal file"),
        (head + "  - mcp: {command: /no/such/server}\n", "command '/no/such/server' is not found"),
        (
            head + "  - mcp: {url: 'http://127.0.0.1:9/mcp', headers: {A: '${NOT_SET_HERE}'}}\n",
            "${NOT_SET_HERE} is not set",
        ),
    ]


def test_bad_tools_entries_exit_2_before_any_model_call_naming_the_entry_and_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delenv("NOT_SET_HERE", raising=False)
    backend = ScriptBackend([])
    with WireServer(backend) as server:
        for number, (text, expected) in enumerate(_bad_goal_files(tmp_path)):
            path = tmp_path / f"g{number}.yaml"
            path.write_text(text)
            out = tmp_path / f"out{number}"
            args = ["run", "--goal-file", str(path), "--yes", "--out", str(out)]
            result = run_cli([*args, "--base-url", server.openai_base_url])
            message = flat(result.output)
            assert result.exit_code == 2, (text, result.output)
            assert expected in message, (expected, message)
            assert f"goal file {path}, line 5" in message or "line 5:" in message, message
            assert not out.exists()  # refused before anything was written
        hits = server.count()
    assert hits == 0  # no model call at all


@contextmanager
def http_mcp_server(log: Path, token: str) -> Iterator[str]:
    """``tests/mcp_server.py`` over streamable HTTP, refusing requests without ``token``."""
    port = free_port()
    env = {**os.environ, "MCP_TEST_TOKEN": token}
    with log.open("w") as handle:
        process = subprocess.Popen(
            [sys.executable, str(SERVER), "--http", str(port)],
            stdout=handle,
            stderr=handle,
            env=env,
        )
    try:
        deadline = time.monotonic() + 20
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                assert time.monotonic() < deadline and process.poll() is None, log.read_text()
                time.sleep(0.05)
        yield f"http://127.0.0.1:{port}/mcp"
    finally:
        process.kill()
        process.wait()


def test_a_header_read_from_the_environment_reaches_the_server_and_is_never_saved(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The token is read when the run starts (and again when it resumes), sent on every
    request, and neither the checkpoint, the run record nor the trace holds it."""
    token = f"tok-{uuid.uuid4().hex}"
    monkeypatch.setenv("TICKETS_TOKEN", token)
    steps = [
        Step(id="sum", title="sum", instruction="add", tool="add", args={"a": 2, "b": 3}),
        Step(id="more", title="more", instruction="add", tool="add", args={"a": "$sum", "b": 1},
             depends_on=["sum"]),
    ]  # fmt: skip
    out, trace = tmp_path / "run", tmp_path / "trace.jsonl"
    with http_mcp_server(tmp_path / "server.log", token) as url:
        headers = {"Authorization": "Bearer ${TICKETS_TOKEN}"}
        tools = [{"mcp": {"url": url, "headers": headers, "name": "tickets"}}]
        path = goal_file(tmp_path / "g.json", tools, goal="Add the numbers")
        with WireServer(ScriptBackend([plan_reply(*steps)])) as server:
            base = ["--base-url", server.openai_base_url, "--trace", f"jsonl={trace}"]
            paused = run_cli(
                ["run", "--goal-file", str(path), "--pause-for-review", "--out", str(out), *base]
            )
            assert paused.exit_code == 3, paused.output
            checkpoint = (out / "checkpoint.json").read_text()
            assert "${TICKETS_TOKEN}" in checkpoint and token not in checkpoint
            resumed = run_cli(["resume", str(out), "--approve", "--trace", f"jsonl={trace}"])
        assert resumed.exit_code == 0, resumed.output
        monkeypatch.delenv("TICKETS_TOKEN")
        again = run_cli(["run", "--goal-file", str(path), "--yes", "--out", str(tmp_path / "b")])
    assert again.exit_code == 2 and "${TICKETS_TOKEN} is not set" in flat(again.output)
    record = RunResult.load(out / "run.json")
    assert record.status == "succeeded" and record.answer == "6"  # 5, then 5 + 1
    for written in out.rglob("*"):
        if written.is_file():
            assert token not in written.read_text(errors="replace"), written
    assert trace.read_text() and token not in trace.read_text()


PYTHON_TOOLS = f'''
import sys
import hierplan

@hierplan.tool(read_only=True)
def shout(text: str) -> str:
    """Say it louder."""
    return text.upper()

@hierplan.tool(destructive=True)
def erase(name: str) -> str:
    """Erase a record."""
    return "erased " + name

toolset = [shout, erase]
server = hierplan.MCPServerStdio(sys.executable, [{str(SERVER)!r}], name="py-server")
again = [shout]
'''


@pytest.mark.anyio
async def test_python_entries_name_tools_and_toolsets(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "mytools.py").write_text(PYTHON_TOOLS)
    monkeypatch.syspath_prepend(str(tmp_path))
    steps = [
        Step(id="a", title="a", instruction="shout", tool="shout", args={"text": "hi"}),
        Step(id="b", title="b", instruction="add", tool="add", args={"a": 1, "b": 2}),
    ]
    model = ScriptedModel([plan_response(Plan(goal="g", steps=steps))])
    spec = RunSpec(
        goal="shout and add",
        model=model,
        strategy="dag",
        tools=[{"python": "mytools:toolset"}, {"python": "mytools:server"}],
    )
    result = await hierplan.run(spec)
    assert result.status == "succeeded", result.error
    assert {n.step_id: n.output for n in result.nodes()} == {
        None: result.answer,
        "a": "HI",
        "b": "3",
    }
    twice = spec.model_copy(update={"tools": (*spec.tools, ToolsetSpec(python="mytools:again"))})
    with pytest.raises(UserInputError) as caught:
        await hierplan.run(twice)
    assert str(caught.value).startswith(
        "two tools are named 'shout': one from tools entry 1 (python mytools:toolset), one from "
        "tools entry 3 (python mytools:again)"
    )


@pytest.mark.anyio
async def test_the_destructive_review_policy_asks_for_plans_that_may_destroy(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "mytools.py").write_text(PYTHON_TOOLS)
    monkeypatch.syspath_prepend(str(tmp_path))
    asked: list[list[str]] = []

    def reviewer(plan: Plan, ctx: GateContext) -> Approve:
        asked.append([s.id for s in plan.steps])
        console = Console(record=True, width=200)
        console.print(review_view(plan, ctx))
        shown.append(console.export_text())
        return Approve(by="dana")

    shown: list[str] = []
    approver = PolicyApprover(CallbackApprover(reviewer), ReviewPolicy.parse("destructive"))
    safe = Step(id="safe", title="safe", instruction="shout", tool="shout", args={"text": "x"})
    risky = Step(id="risky", title="risky", instruction="erase", tool="erase", args={"name": "x"})
    free = Step(id="free", title="free", instruction="anything")  # may use every tool
    limited = Step(id="limited", title="limited", instruction="shout it", tools=["shout"])
    for steps, expected in (([safe, limited], False), ([safe, risky], True), ([free], True)):
        answers = [plan_response(Plan(goal="g", steps=steps))]
        answers += [text_response("done")] * sum(s.tool is None for s in steps)
        result = await hierplan.run(
            RunSpec(
                goal="g",
                model=ScriptedModel(answers),
                strategy="dag",
                tools=[{"python": "mytools:toolset"}],
            ),
            approver=approver,
        )
        assert result.status == "succeeded", result.error
        assert (asked[-1:] == [[s.id for s in steps]]) == expected, (steps, asked)
        if not expected:
            decided = result.tree.plan_versions[-1]
            assert "review policy destructive" in str(decided.decided_by)
    assert "destructive tools this plan may use: erase" in shown[0]
    assert "tool=erase [destructive]" in shown[0] and "tool=shout [read-only]" in shown[0]
    assert str(ReviewPolicy.parse("destructive")) == "destructive"


def test_bench_gives_every_run_the_toolsets_of_its_flags(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "mytools.py").write_text(PYTHON_TOOLS)
    monkeypatch.syspath_prepend(str(tmp_path))
    out = tmp_path / "bench"
    args = ["bench", "--suite", "game24", "--strategies", "dag", "--tasks", "1", "--seeds", "1"]
    args += ["--sim-latency-scale", "0", "--no-plot", "--out", str(out)]
    token = f"tok-{uuid.uuid4().hex}"
    monkeypatch.setenv("BENCH_TOKEN", token)
    server = {"command": sys.executable, "args": [str(SERVER)], "env": {"T": "${BENCH_TOKEN}"}}
    given = ["--tools", "mytools:toolset", "--mcp", json.dumps(server)]
    result = run_cli([*args, *given])
    assert result.exit_code == 0, result.output
    summary = (out / "summary.md").read_text()
    assert "--tools mytools:toolset" in summary and "--mcp" in summary
    manifest = json.loads((out / "bench.json").read_text())
    assert manifest["tools"] == [{"python": "mytools:toolset"}, {"mcp": server}]
    for written in out.rglob("*"):  # the variable as written, never its value
        assert written.is_dir() or token not in written.read_text(errors="replace"), written
    again = run_cli([*args, *given, "--resume"])
    assert again.exit_code == 0, again.output
    other = run_cli([*args, "--tools", "mytools:toolset", "--resume"])
    assert other.exit_code == 2 and "cannot resume" in flat(other.output)
    assert "--tools/--mcp: " in flat(other.output)  # named by its flags
    refused = run_cli([*args, "--mcp", "/no/such/server", "--out", str(tmp_path / "b2")])
    assert refused.exit_code == 2
    assert "command '/no/such/server' is not found" in flat(refused.output)
