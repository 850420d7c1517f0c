"""Tools from a real MCP server (``tests/mcp_server.py``, written with the ``mcp`` SDK)."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import sys
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, TextIO

import anyio
import mcp_types
import pytest
from capitals import CapitalsOracle, goal_for
from eventcheck import check_events
from mcp import Client, StdioServerParameters

import hierplan
from hierplan import FunctionModel, ModelRequest, ModelResponse, ToolCall
from hierplan.agents.prompts import PlanPrompt, StepPrompt
from hierplan.core.events import Replanned, RunEvent, ToolCalled
from hierplan.errors import (
    ToolArgsError,
    ToolError,
    ToolServerGone,
    ToolTimeoutError,
    UnexpectedModelCall,
    UserInputError,
)
from hierplan.models.scripted import plan_response
from hierplan.plans.plan import Plan, Step
from hierplan.simulator.oracle import Action
from hierplan.tools.mcp import MCPServerStdio, MCPServerStreamableHTTP, MCPTool

SERVER = Path(__file__).with_name("mcp_server.py")
TOOL_NAMES = ("add", "lookup", "slow", "whoami", "stock", "pair", "wipe")


@pytest.fixture
def errlog(tmp_path: Path) -> Iterator[TextIO]:
    """The server's stderr, kept out of the test output."""
    with (tmp_path / "server.err").open("w") as handle:
        yield handle


@pytest.fixture
def server(errlog: TextIO) -> MCPServerStdio:
    return MCPServerStdio(sys.executable, [str(SERVER)], name="tools", errlog=errlog)


def _by_name(tools: Any) -> dict[str, MCPTool]:
    return {t.name: t for t in tools}


@pytest.mark.anyio
async def test_server_tools_become_hierplan_tools_with_their_schemas(
    server: MCPServerStdio, errlog: TextIO
) -> None:
    params = StdioServerParameters(command=sys.executable, args=[str(SERVER)])
    async with Client(params) as raw:
        listed = {t.name: t for t in (await raw.list_tools()).tools}
    async with server.open() as tools:
        found = _by_name(tools)
        assert set(found) == set(listed) == set(TOOL_NAMES)
        for name, tool in found.items():
            assert isinstance(tool, hierplan.Tool)
            assert tool.parameters == listed[name].input_schema
            assert tool.spec.parameters == listed[name].input_schema  # what models see
            assert tool.description == listed[name].description
        assert await found["add"].call({"a": 2, "b": 40}) == 42  # the value, not {"result": 42}
        assert await found["lookup"].call({"country": "Peru"}) == "Lima"
        with pytest.raises(ToolArgsError, match=r"invalid arguments for tool 'add': .*'b'"):
            await found["add"].call({"a": 1})
        with pytest.raises(ToolArgsError, match="a: 'x' is not of type 'integer'"):
            found["add"].validate({"a": "x", "b": 1})
        with pytest.raises(ToolError, match="no capital known for 'mars'"):
            await found["lookup"].call({"country": "mars"})
    prefixed = MCPServerStdio(
        sys.executable, [str(SERVER)], tool_prefix="geo_", include=["lookup"], errlog=errlog
    )
    async with prefixed.open() as tools:
        (only,) = tools
        assert only.name == "geo_lookup"
        assert await only.call({"country": "japan"}) == "Tokyo"


@pytest.mark.anyio
async def test_a_tool_call_may_take_longer_than_connecting_does(errlog: TextIO) -> None:
    quick_to_connect = MCPServerStdio(
        sys.executable, [str(SERVER)], timeout_s=10, connect_timeout_s=1, errlog=errlog
    )
    async with quick_to_connect.open() as tools:
        slow = _by_name(tools)["slow"]
        assert await slow.call({"seconds": 1.5}) == "waited 1.5 s"  # timeout_s bounds it


@pytest.mark.anyio
async def test_executors_call_mcp_tools_in_a_three_level_run(server: MCPServerStdio) -> None:
    events: list[RunEvent] = []
    result = await hierplan.run(
        goal_for([["france", "japan"], ["peru"]], 20, 22),
        tools=[server],
        listeners=[events.append],
        model=hierplan.Simulator(latency_scale=0, profile="ideal", oracle=CapitalsOracle()),
    )
    assert result.status == "succeeded", result.error
    assert {n.depth for n in result.nodes()} == {1, 2, 3}
    check_events(events, result)
    calls = [e for e in events if isinstance(e, ToolCalled)]
    assert sorted(e.tool for e in calls) == ["add", "lookup", "lookup", "lookup"]
    assert all(e.ok for e in calls)
    for capital in ("Paris", "Tokyo", "Lima", "42"):
        assert capital in result.answer


def _plan_response(steps: list[Step]) -> ModelResponse:
    plan = Plan(goal="g", steps=steps).model_dump(mode="json", exclude_none=True)
    return ModelResponse(output=plan)


@pytest.mark.anyio
async def test_step_allowlists_apply_to_mcp_tools(server: MCPServerStdio) -> None:
    """A step limited to ``lookup`` offers the model only ``lookup``, and refuses ``add``."""
    offered: list[list[str]] = []
    replies: list[str] = []

    def model(request: ModelRequest) -> ModelResponse:
        if request.phase == "planning":
            step = Step(id="a", title="A", instruction="Capital of France", tools=["lookup"])
            return _plan_response([step])
        offered.append([t.name for t in request.tools])
        replies.extend(m.content for m in request.messages if m.role == "tool")
        turn = len(offered)
        if turn == 1:
            return ModelResponse(tool_calls=(ToolCall("c1", "add", {"a": 1, "b": 2}),))
        if turn == 2:
            return ModelResponse(tool_calls=(ToolCall("c2", "lookup", {"country": "france"}),))
        return ModelResponse(text="Paris")

    events: list[RunEvent] = []
    result = await hierplan.run(
        "Find the capital of France",
        model=FunctionModel(model),
        strategy="dag",
        tools=[server],
        listeners=[events.append],
    )
    assert result.status == "succeeded", result.error
    assert offered == [["lookup"]] * 3
    assert replies[0] == "ERROR: tool 'add' is not allowed for this node"
    assert [e.tool for e in events if isinstance(e, ToolCalled)] == ["lookup"]


class _KillOracle:
    """Plan v1 waits on the MCP server's ``slow`` tool; after a failure, a local step instead."""

    def __init__(self) -> None:
        self.failures: list[str] = []

    def plan(self, prompt: PlanPrompt) -> Plan | None:
        capital = Step(
            id="capital",
            title="Capital",
            instruction="Look up",
            tool="lookup",
            args={"country": "peru"},
        )
        if prompt.failure is None:
            wait = Step(
                id="wait", title="Wait", instruction="Wait", tool="slow", args={"seconds": 30}
            )
            return Plan(goal=prompt.goal, steps=[capital, wait])
        self.failures.append(prompt.failure)
        note = Step(id="note", title="Note", instruction="Note", tool="note", args={"text": "done"})
        return Plan(goal=prompt.goal, steps=[capital, note])

    def act(self, prompt: StepPrompt, done: Any) -> Action | None:
        return None


@pytest.mark.anyio
async def test_a_server_killed_mid_run_fails_its_steps_and_the_planner_replans(
    server: MCPServerStdio,
) -> None:
    @hierplan.tool
    def note(text: str) -> str:
        """Write a note."""
        return f"noted: {text}"

    oracle = _KillOracle()
    waiting = anyio.Event()
    events: list[RunEvent] = []

    def listen(event: RunEvent) -> None:
        events.append(event)
        if event.type == "node_started" and getattr(event, "step_id", None) == "wait":
            waiting.set()

    async with server.open() as tools:
        pid = await _by_name(tools)["whoami"].call({})

        async def kill_when_waiting() -> None:
            await waiting.wait()
            await anyio.sleep(0.3)
            os.kill(pid, signal.SIGKILL)

        started = time.perf_counter()
        async with anyio.create_task_group() as tg:
            tg.start_soon(kill_when_waiting)
            result = await hierplan.run(
                "Look up a capital and wait for the server",
                strategy="dag",
                tools=[*tools, note],
                listeners=[listen],
                model=hierplan.Simulator(latency_scale=0, profile="ideal", oracle=oracle),
            )
        took = time.perf_counter() - started
    assert took < 10  # the server's tool would have taken 30 s: nothing waited for it
    assert result.status == "succeeded", result.error
    waited = next(n for n in result.nodes() if n.step_id == "wait")
    assert waited.status == "failed"
    assert "MCP server 'tools' is gone" in (waited.error or "")
    assert waited.attempts == 1  # a dead server is not retried
    assert len(oracle.failures) == 1 and "is gone" in oracle.failures[0]
    (replan,) = [e for e in events if isinstance(e, Replanned)]
    assert replan.added == ["note"] and replan.removed == ["wait"]
    lookups = [e for e in events if isinstance(e, ToolCalled) and e.tool == "lookup"]
    assert len(lookups) == 1  # the finished step was kept, not run again
    check_events(events, result)


@pytest.mark.anyio
async def test_a_hung_server_runs_into_the_tool_timeout(errlog: TextIO) -> None:
    server = MCPServerStdio(sys.executable, [str(SERVER)], timeout_s=0.5, errlog=errlog)
    async with server.open() as tools:
        found = _by_name(tools)
        pid = await found["whoami"].call({})
        os.kill(pid, signal.SIGSTOP)
        try:
            started = time.perf_counter()
            with pytest.raises(ToolTimeoutError, match=r"did not finish within 0\.5 s"):
                await found["add"].call({"a": 1, "b": 2})
            assert time.perf_counter() - started < 2
        finally:
            os.kill(pid, signal.SIGKILL)
    with pytest.raises(ToolServerGone):
        await found["add"].call({"a": 1, "b": 2})  # the connection is closed after the block


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


async def _wait_for_port(port: int) -> None:
    with anyio.fail_after(20):
        while True:
            try:
                stream = await anyio.connect_tcp("127.0.0.1", port)
            except OSError:
                await anyio.sleep(0.05)
            else:
                await stream.aclose()
                return


@pytest.fixture
async def http_server(errlog: TextIO) -> AsyncIterator[tuple[str, anyio.abc.Process]]:
    async with _http_process(errlog) as found:
        yield found


@asynccontextmanager
async def _http_process(
    errlog: TextIO, token: str | None = None
) -> AsyncIterator[tuple[str, anyio.abc.Process]]:
    """The test server over streamable HTTP, requiring ``Bearer token`` when one is given."""
    port = _free_port()
    env = {**os.environ, **({"MCP_TEST_TOKEN": token} if token else {})}
    process = await anyio.open_process(
        [sys.executable, str(SERVER), "--http", str(port)], stdout=errlog, stderr=errlog, env=env
    )
    try:
        await _wait_for_port(port)
        yield f"http://127.0.0.1:{port}/mcp", process
    finally:
        if process.returncode is None:
            process.kill()
        await process.wait()


@pytest.mark.anyio
async def test_streamable_http_server(http_server: tuple[str, anyio.abc.Process]) -> None:
    url, process = http_server
    server = MCPServerStreamableHTTP(url, name="geo")
    events: list[RunEvent] = []
    result = await hierplan.run(
        goal_for([["peru", "chile"]], 1, 2),
        tools=[server],
        listeners=[events.append],
        model=hierplan.Simulator(latency_scale=0, profile="ideal", oracle=CapitalsOracle()),
    )
    assert result.status == "succeeded", result.error
    assert "Lima" in result.answer and "Santiago" in result.answer
    check_events(events, result)
    async with server.open() as tools:
        found = _by_name(tools)
        assert await found["add"].call({"a": 3, "b": 4}) == 7
        process.kill()
        await process.wait()
        started = time.perf_counter()
        with pytest.raises(ToolServerGone, match="MCP server 'geo' is gone"):
            await found["add"].call({"a": 3, "b": 4})
        assert time.perf_counter() - started < 5


@pytest.mark.anyio
async def test_servers_that_cannot_be_used_give_a_clear_error(errlog: TextIO) -> None:
    missing = MCPServerStdio("/nonexistent/server", name="gone", errlog=errlog)
    with pytest.raises(
        UserInputError, match=r"cannot use MCP server 'gone' \(/nonexistent/server\)"
    ):
        async with missing.open():
            pytest.fail("must not open")
    quits = MCPServerStdio(sys.executable, ["-c", "pass"], name="quits", errlog=errlog)
    with pytest.raises(UserInputError, match="cannot use MCP server 'quits'"):
        await hierplan.run(
            "anything", model=FunctionModel(lambda r: ModelResponse()), tools=[quits]
        )
    closed = MCPServerStreamableHTTP(f"http://127.0.0.1:{_free_port()}/mcp", name="closed")
    with pytest.raises(UserInputError, match="cannot use MCP server 'closed'"):
        async with hierplan.start(
            "anything", model=FunctionModel(lambda r: ModelResponse()), tools=[closed]
        ):
            pytest.fail("must not start")
    unknown = MCPServerStdio(sys.executable, [str(SERVER)], include=["nope"], errlog=errlog)
    with pytest.raises(
        UserInputError, match=r"it has no tool 'nope' \(its tools: add, lookup, pair"
    ):
        async with unknown.open():
            pytest.fail("must not open")
    with pytest.raises(UserInputError, match="must start with http:// or https://"):
        MCPServerStreamableHTTP("localhost:8000/mcp")
    with pytest.raises(UserInputError, match="tools= takes hierplan tools"):
        await hierplan.run("anything", model=FunctionModel(lambda r: ModelResponse()), tools=["x"])  # type: ignore[list-item]


class _WaitOracle:
    """One plan: ask the server its process id, then wait on its ``slow`` tool."""

    def plan(self, prompt: PlanPrompt) -> Plan | None:
        who = Step(id="who", title="Who", instruction="Who", tool="whoami", args={})
        wait = Step(
            id="wait",
            title="Wait",
            instruction="Wait",
            tool="slow",
            args={"seconds": 30},
            depends_on=["who"],
        )
        return Plan(goal=prompt.goal, steps=[who, wait])

    def act(self, prompt: StepPrompt, done: Any) -> Action | None:
        return None


@pytest.mark.anyio
async def test_cancelling_a_run_stops_its_mcp_server(server: MCPServerStdio) -> None:
    """The run's own server process is stopped with the run; no task is left behind."""
    before = asyncio.all_tasks()
    async with hierplan.start(
        "Wait on the server",
        strategy="dag",
        tools=[server],
        model=hierplan.Simulator(latency_scale=0, profile="ideal", oracle=_WaitOracle()),
    ) as handle:
        async for event in handle.events():
            if event.type == "node_started" and getattr(event, "step_id", None) == "wait":
                started = time.perf_counter()
                handle.cancel()
        result = await handle.result()
    assert time.perf_counter() - started < 5
    assert result.status == "cancelled"
    who = next(n for n in result.nodes() if n.step_id == "who")
    pid = int(who.output or "")
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)  # the server process is gone
    assert asyncio.all_tasks() == before


@pytest.mark.anyio
async def test_an_error_inside_an_open_server_comes_out_as_itself(server: MCPServerStdio) -> None:
    with pytest.raises(KeyError, match="mine"):
        async with server.open():
            raise KeyError("mine")
    # A run's own error (here: a script with no answers) is not wrapped in an ExceptionGroup
    # by the server the run opened.
    with pytest.raises(UnexpectedModelCall, match="its script has 0 item"):
        await hierplan.run("g", model=hierplan.ScriptedModel([]), tools=[server], strategy="dag")


@pytest.mark.parametrize("option", ["timeout_s", "connect_timeout_s"])
def test_an_mcp_deadline_that_is_not_a_number_is_refused(option: str) -> None:
    with pytest.raises(UserInputError, match="timeouts must be more than 0 seconds"):
        bad: dict[str, Any] = {option: float("nan")}
        MCPServerStdio(sys.executable, [str(SERVER)], **bad)


@pytest.mark.anyio
async def test_a_schema_with_a_reference_to_nowhere_lets_the_server_judge(
    server: MCPServerStdio,
) -> None:
    # check_schema accepts a "$ref" that points nowhere; only validating arguments finds it.
    odd = {
        "type": "object",
        "properties": {"a": {"$ref": "#/$defs/Int"}, "b": {"type": "integer"}},
    }
    async with server.open() as tools:
        real = _by_name(tools)["add"]
        add = MCPTool(real._connection, mcp_types.Tool(name="add", input_schema=odd))
        assert add.validate({"a": 1, "b": 2}) == {"a": 1, "b": 2}
        with pytest.raises(ToolError, match="MCP tool 'add' failed: Error executing tool add"):
            await add.call({"a": "x", "b": 2})  # the server still refuses what is wrong
        step = Step(id="s", title="s", instruction="add", tool="add", args={"a": 1, "b": 2})
        model = hierplan.ScriptedModel([plan_response(Plan(goal="g", steps=[step]))])
        result = await hierplan.run("add", model=model, tools=[add], strategy="dag")
        # No output schema says the object wraps a plain value: it stays the object.
        assert result.status == "succeeded" and result.answer == '{"result": 3}'


@pytest.mark.anyio
async def test_a_schema_is_checked_by_the_draft_its_schema_key_names(
    server: MCPServerStdio,
) -> None:
    # "dependencies" is a draft-07 keyword that 2020-12 ignores: checked as 2020-12, "a"
    # without "b" would pass and only the server could refuse it.
    draft7 = {
        "$schema": "http://json-schema.org/draft-07/schema#",
        "type": "object",
        "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
        "dependencies": {"a": ["b"]},
    }
    async with server.open() as tools:
        real = _by_name(tools)["add"]
        add = MCPTool(real._connection, mcp_types.Tool(name="add", input_schema=draft7))
        with pytest.raises(ToolArgsError, match="'b' is a dependency of 'a'"):
            add.validate({"a": 1})
        assert add.validate({"a": 1, "b": 2}) == {"a": 1, "b": 2}


@pytest.mark.anyio
async def test_invalid_mcp_arguments_name_at_most_ten_problems(server: MCPServerStdio) -> None:
    many = {
        "type": "object",
        "properties": {f"p{i}": {"type": "integer"} for i in range(15)},
    }
    async with server.open() as tools:
        real = _by_name(tools)["add"]
        wide = MCPTool(real._connection, mcp_types.Tool(name="wide", input_schema=many))
        with pytest.raises(ToolArgsError) as caught:
            wide.validate({f"p{i}": "x" for i in range(15)})
    message = str(caught.value)
    assert message.count("is not of type 'integer'") == 10
    assert message.endswith("; and 5 more")


def _one_step_plan(*steps: Step) -> hierplan.ScriptedModel:
    return hierplan.ScriptedModel([plan_response(Plan(goal="g", steps=list(steps)))])


@pytest.mark.anyio
async def test_a_plain_value_reaches_later_steps_as_the_value(server: MCPServerStdio) -> None:
    """``add`` returns 5, which the SDK sends as ``{"result": 5}``: the next step gets 5."""
    first = Step(id="a", title="a", instruction="add", tool="add", args={"a": 2, "b": 3})
    second = Step(
        id="b",
        title="b",
        instruction="add",
        tool="add",
        args={"a": "$a", "b": 10},
        depends_on=["a"],
    )
    result = await hierplan.run("add", model=_one_step_plan(first, second), tools=[server])
    assert result.status == "succeeded", result.error
    assert result.answer == "15"
    async with server.open() as tools:
        assert await _by_name(tools)["pair"].call({}) == {"a": 1, "b": 2}  # an object as it is


@pytest.mark.anyio
@pytest.mark.parametrize("retry", [False, True])
async def test_a_tools_own_error_fails_the_step_with_the_servers_message(
    errlog: TextIO, retry: bool
) -> None:
    """``isError`` is the tool's answer, not a transient failure: not retried, unless the
    server is made with ``retry_tool_errors``."""
    server = MCPServerStdio(sys.executable, [str(SERVER)], errlog=errlog, retry_tool_errors=retry)
    step = Step(id="c", title="c", instruction="look up", tool="lookup", args={"country": "mars"})
    events: list[RunEvent] = []
    result = await hierplan.run(
        "capital of mars",
        model=_one_step_plan(step),
        tools=[server],
        # Retries only, no call decided again (tests/test_redecide.py).
        settings={
            "max_retries": 2,
            "retry_backoff_s": 0.01,
            "max_replans": 0,
            "redecide_tool_calls": False,
        },
        listeners=[events.append],
    )
    node = next(n for n in result.nodes() if n.step_id == "c")
    assert node.status == "failed"
    assert "no capital known for 'mars'" in (node.error or "")
    calls = [e for e in events if isinstance(e, ToolCalled)]
    assert len(calls) == (3 if retry else 1)
    assert node.attempts == len(calls)


@pytest.mark.anyio
async def test_tool_annotations_become_hints(server: MCPServerStdio) -> None:
    async with server.open() as tools:
        found = _by_name(tools)
    assert found["add"].hints.read_only and not found["add"].hints.may_destroy
    assert found["wipe"].hints.destructive and found["wipe"].hints.may_destroy
    assert found["lookup"].hints == hierplan.ToolHints()  # says nothing: may destroy
    assert found["lookup"].hints.may_destroy
    assert found["add"].source == "MCP server tools"


@pytest.mark.anyio
async def test_a_server_that_fails_to_start_is_reported_with_its_stderr(errlog: TextIO) -> None:
    script = "import sys; sys.stderr.write('loading config\\nboom: no API key set\\n'); sys.exit(3)"
    broken = MCPServerStdio(sys.executable, ["-c", script], name="broken", errlog=errlog)
    with pytest.raises(UserInputError) as caught:
        async with broken.open():
            pytest.fail("must not open")
    message = str(caught.value)
    assert message.startswith("cannot use MCP server 'broken'")
    assert message.endswith("its stderr ends with:\n    loading config\n    boom: no API key set")
    errlog.flush()
    assert "boom: no API key set" in await anyio.Path(errlog.name).read_text()  # passed on as well


@pytest.mark.anyio
async def test_streamable_http_headers_reach_the_server(errlog: TextIO) -> None:
    async with _http_process(errlog, token="s3cret") as (url, _process):
        allowed = MCPServerStreamableHTTP(url, headers={"Authorization": "Bearer s3cret"})
        async with allowed.open() as tools:
            assert await _by_name(tools)["add"].call({"a": 1, "b": 1}) == 2
        refused = MCPServerStreamableHTTP(url, name="nokey", shown="the tickets server")
        with pytest.raises(UserInputError, match=r"MCP server 'nokey' \(the tickets server\)"):
            async with refused.open():
                pytest.fail("must not open")
