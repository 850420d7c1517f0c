"""Tracing: the whole span tree, cost invariants, events, errors, content and metrics."""

from __future__ import annotations

import json
import os
from collections.abc import AsyncIterator, Iterator, Mapping, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from pathlib import Path
from typing import Any, Literal, cast

import anyio
import pytest
from opentelemetry.sdk.metrics.export import HistogramDataPoint, NumberDataPoint
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.sdk.trace.sampling import ALWAYS_OFF, ALWAYS_ON, Sampler
from tracing_support import (
    PRICED_AS,
    ScriptedRun,
    Telemetry,
    check_cost_invariants,
    children_of,
    span_tree,
)

import hierplan
from hierplan import (
    Approve,
    CallbackApprover,
    Defer,
    FunctionModel,
    GateContext,
    Instrument,
    Model,
    ModelRequest,
    ModelResponse,
    Plan,
    PriceTable,
    RunEvent,
    ScriptedModel,
    Step,
    Tool,
    Usage,
)
from hierplan.core.views import NodeView, RunView
from hierplan.errors import ModelError, ToolArgsError
from hierplan.models.scripted import plan_response
from hierplan.tracing.otel import (
    DURATION_BUCKETS,
    EVENT_TEXT_LIMIT,
    TOKEN_BUCKETS,
    Tracing,
    redact,
)

SNAPSHOT = Path(__file__).parent / "snapshots" / "trace_scripted.json"


def _chat_cost(span: ReadableSpan) -> float:
    return float((span.attributes or {}).get("gen_ai.usage.cost", 0.0))  # type: ignore[arg-type]


def _attr(span: ReadableSpan, key: str) -> Any:
    return (span.attributes or {})[key]


@pytest.fixture(scope="module")
def migration() -> Iterator[tuple[hierplan.RunResult, list[ReadableSpan]]]:
    """The data-migration demo (three levels, a replan), traced once for several tests."""
    telemetry = Telemetry()
    import tempfile

    with tempfile.TemporaryDirectory() as where:
        result = hierplan.run_sync(
            scenario="data_migration",
            workdir=Path(where),
            instruments=[telemetry.tracing()],
            model=hierplan.Simulator(latency_scale=0),
        )
    # The simulator's noise can make a demo run fail now and then; its trace must add up all
    # the same, so any outcome is fine here.
    assert result.status in ("succeeded", "partial", "failed"), result.error
    yield result, telemetry.finished()


@pytest.mark.anyio
async def test_span_tree_of_a_three_level_run_matches_the_snapshot() -> None:
    telemetry = Telemetry()
    scripted = ScriptedRun()
    result = await hierplan.run(instruments=[telemetry.tracing()], **scripted.run_options())
    assert result.status == "succeeded", result.error
    assert {n.depth for n in result.nodes()} == {1, 2, 3}
    spans = telemetry.finished()
    (workflow,) = [s for s in spans if s.parent is None]
    assert _attr(workflow, "hierplan.price_table") == result.price_table == PriceTable().version
    assert (
        _attr(workflow, "hierplan.peak_concurrent_leaves") == result.stats["peak_concurrent_leaves"]
    )
    tree = span_tree(spans)
    if os.environ.get("HIERPLAN_UPDATE_SNAPSHOTS") == "1":
        SNAPSHOT.parent.mkdir(exist_ok=True)
        SNAPSHOT.write_text(json.dumps(tree, indent=1, sort_keys=True) + "\n")
    assert tree == json.loads(SNAPSHOT.read_text())


@pytest.mark.anyio
async def test_costs_add_up_in_the_scripted_run() -> None:
    telemetry = Telemetry()
    result = await hierplan.run(instruments=[telemetry.tracing()], **ScriptedRun().run_options())
    check_cost_invariants(result, telemetry.finished())


@pytest.mark.anyio
@pytest.mark.parametrize("reported", [None, Usage(-5, 40)], ids=["no usage", "impossible usage"])
@pytest.mark.parametrize("budget_tokens", [None, 100_000], ids=["unbudgeted", "budgeted"])
async def test_chat_spans_count_a_reply_as_the_record_does(
    reported: Usage | None, budget_tokens: int | None
) -> None:
    """A reply without usage counts at its worst case, impossible usage as the nearest
    possible; the chat span must count it so too, or spans and rollups disagree."""
    plan = {"goal": "greet", "steps": [{"id": "a", "title": "greet", "instruction": "say hi"}]}

    def answer(request: ModelRequest) -> ModelResponse:
        if request.phase == "planning":
            return ModelResponse(output=plan, usage=Usage(100, 20))
        return ModelResponse(text="hi", usage=reported)

    model = FunctionModel(answer, name="m", priced_as=PRICED_AS, report_usage=False)
    telemetry = Telemetry()
    result = await hierplan.run(
        "greet",
        model=model,
        strategy="dag",
        instruments=[telemetry.tracing()],
        budget={"tokens": budget_tokens},
    )
    assert result.status == "succeeded", result.error
    spans = telemetry.finished()
    check_cost_invariants(result, spans)
    (leaf_chat,) = [
        s for s in spans if s.name == "chat m" and _attr(s, "hierplan.phase") == "execution"
    ]
    flag = "no_usage" if reported is None else "invalid_usage"
    assert flag in _attr(leaf_chat, "hierplan.flags")
    assert flag in result.tree.find("1.1").calls[0].flags


@pytest.mark.anyio
@pytest.mark.parametrize("budget_tokens", [None, 100_000], ids=["unbudgeted", "budgeted"])
async def test_a_failed_call_with_impossible_usage_counts_the_nearest_possible(
    budget_tokens: int | None,
) -> None:
    """An error that reports impossible usage (a negative count) is recorded, traced and
    settled as the nearest possible usage: never a negative cost."""
    plan = {"goal": "greet", "steps": [{"id": "a", "title": "greet", "instruction": "say hi"}]}

    def answer(request: ModelRequest) -> ModelResponse:
        if request.phase == "planning":
            return ModelResponse(output=plan, usage=Usage(100, 20))
        raise ModelError("refused", retryable=False, usage=Usage(-50, 7))

    model = FunctionModel(answer, name="m", priced_as=PRICED_AS, report_usage=False)
    telemetry = Telemetry()
    result = await hierplan.run(
        "greet",
        model=model,
        strategy="dag",
        settings=hierplan.RunSettings(max_retries=0, max_replans=0),
        instruments=[telemetry.tracing()],
        budget={"tokens": budget_tokens},
    )
    (call,) = result.tree.find("1.1").calls
    assert call.usage == Usage(0, 7) and call.cost_usd is not None and call.cost_usd > 0
    assert call.flags == ["invalid_usage", "failed"]
    spans = telemetry.finished()
    check_cost_invariants(result, spans)
    (leaf_chat,) = [
        s for s in spans if s.name == "chat m" and _attr(s, "hierplan.phase") == "execution"
    ]
    assert _attr(leaf_chat, "gen_ai.usage.input_tokens") == 0
    assert _attr(leaf_chat, "gen_ai.usage.output_tokens") == 7


@pytest.mark.anyio
async def test_cache_writes_are_on_chat_spans_and_in_the_rollups() -> None:
    plan = {"goal": "greet", "steps": [{"id": "a", "title": "greet", "instruction": "say hi"}]}
    written = Usage(400, 10, cache_write_tokens=300, cache_write_1h_tokens=100)

    def answer(request: ModelRequest) -> ModelResponse:
        if request.phase == "planning":
            return ModelResponse(output=plan, usage=Usage(100, 20))
        return ModelResponse(text="hi", usage=written)

    model = FunctionModel(answer, name="m", priced_as="anthropic:claude-haiku-4-5")
    telemetry = Telemetry()
    result = await hierplan.run(
        "greet", model=model, strategy="dag", instruments=[telemetry.tracing()]
    )
    spans = telemetry.finished()
    check_cost_invariants(result, spans)
    chats = {_attr(s, "hierplan.phase"): s for s in spans if s.name == "chat m"}
    leaf = chats["execution"]
    assert _attr(leaf, "gen_ai.usage.cache_creation.input_tokens") == 300
    assert _attr(leaf, "hierplan.usage.cache_creation_1h.input_tokens") == 100
    # five-minute writes at 1.25x the $1/M input price, one-hour writes at 2x
    assert _attr(leaf, "gen_ai.usage.cost") == pytest.approx(
        (100 * 1 + 200 * 1.25 + 100 * 2 + 10 * 5) / 1e6
    )
    planning = chats["planning"]
    assert "gen_ai.usage.cache_creation.input_tokens" not in (planning.attributes or {})
    (workflow,) = [s for s in spans if s.parent is None]
    assert _attr(workflow, "gen_ai.aggregated_usage.cache_creation.input_tokens") == 300


def test_costs_add_up_in_the_data_migration_run(
    migration: tuple[hierplan.RunResult, list[ReadableSpan]],
) -> None:
    result, spans = migration
    check_cost_invariants(result, spans)
    assert result.totals()["cost_usd"] > 0


def test_data_migration_trace_has_the_plan_tree(
    migration: tuple[hierplan.RunResult, list[ReadableSpan]],
) -> None:
    result, spans = migration
    index = children_of(spans)
    (workflow,) = index[None]
    assert workflow.name == "invoke_workflow hierplan"
    agents = {_attr(s, "hierplan.node.path"): s for s in spans if s.name.startswith("invoke_agent")}
    started = [n for n in result.nodes() if n.started_at is not None]
    assert set(agents) == {n.path for n in started}
    assert len(agents) == len(started)  # one span per node that ran
    for node in started:
        span = agents[node.path]
        assert span.name == f"invoke_agent {node.kind}"
        assert _attr(span, "hierplan.node.depth") == node.depth
        assert _attr(span, "hierplan.simulated") is True
        parent = span.parent
        assert parent is not None
        expected = workflow if node.depth == 1 else agents[node.path.rpartition(".")[0]]
        assert parent.span_id == expected.context.span_id
        plans = [c for c in index[span.context.span_id] if c.name == "plan planner"]
        assert len(plans) == len(node.plan_versions)
        for plan in plans:
            (chat,) = index[plan.context.span_id]
            assert chat.name == "chat sim" and chat.kind.name == "CLIENT"
            assert _attr(chat, "hierplan.phase") == "planning"
    replanned = sorted(
        str((e.attributes or {})["hierplan.node.path"])
        for s in spans
        for e in s.events
        if e.name == "hierplan.replanned"
    )
    assert replanned == sorted(
        n.path for n in result.nodes() for v in n.plan_versions if v.reason == "replan"
    )


@pytest.mark.anyio
async def test_failures_set_span_status() -> None:
    telemetry = Telemetry()
    result = await hierplan.run(instruments=[telemetry.tracing()], **ScriptedRun().run_options())
    spans = telemetry.finished()
    by_path: dict[tuple[str, str], list[ReadableSpan]] = {}
    for span in spans:
        key = (span.name, str((span.attributes or {}).get("hierplan.node.path")))
        by_path.setdefault(key, []).append(span)
    (broken_leaf,) = by_path[("invoke_agent executor", "1.2.1")]
    assert broken_leaf.status.status_code.name == "ERROR"
    assert "broken tool" in (broken_leaf.status.description or "")
    assert _attr(broken_leaf, "hierplan.node.status") == "failed"
    (broken_tool,) = by_path[("execute_tool broken", "1.2.1")]
    assert broken_tool.status.status_code.name == "ERROR"
    assert _attr(broken_tool, "error.type") == "ToolArgsError"
    first, second, third = by_path[("chat test-model", "1.1.2")]
    assert first.status.status_code.name == "ERROR"
    assert _attr(first, "error.type") == "ModelError"
    assert _attr(first, "gen_ai.usage.input_tokens") == 300  # the failed attempt's usage counts
    assert second.status.status_code.name == third.status.status_code.name == "UNSET"
    (retrying,) = by_path[("invoke_agent executor", "1.1.2")]
    (event,) = [e for e in retrying.events if e.name == "hierplan.step_retried"]
    assert (event.attributes or {})["hierplan.error"] == "overloaded"
    (flaky,) = by_path[("invoke_agent executor", "1.1.3")]
    assert [e.name for e in flaky.events] == ["hierplan.step_retried"]
    dropped = result.tree.find("1.2.2")
    assert dropped.status == "cancelled" and dropped.started_at is None
    assert ("invoke_agent executor", "1.2.2") not in by_path  # it never ran: no span
    (replanning,) = by_path[("invoke_agent planner", "1.2")]
    (replan,) = [e for e in replanning.events if e.name == "hierplan.replanned"]
    assert (replan.attributes or {})["hierplan.diff"] == "+1 -2 ~0 (added: r2; removed: r, after)"


@pytest.mark.anyio
@pytest.mark.parametrize(
    ("budget_tokens", "run_status", "root_status", "span_status"),
    [
        (None, "succeeded", "succeeded", "UNSET"),
        # Out of budget at its first planning call: the root is budget_exhausted, the run partial.
        (2000, "partial", "budget_exhausted", "ERROR"),
    ],
)
async def test_the_workflow_span_says_the_run_s_status_beside_its_root_s(
    budget_tokens: int | None, run_status: str, root_status: str, span_status: str
) -> None:
    telemetry = Telemetry()
    result = await hierplan.run(
        instruments=[telemetry.tracing()],
        budget={"tokens": budget_tokens},
        **ScriptedRun().run_options(),
    )
    assert (result.status, result.tree.status) == (run_status, root_status), result.error
    (workflow,) = [s for s in telemetry.finished() if s.parent is None]
    assert _attr(workflow, "hierplan.run.status") == run_status
    assert _attr(workflow, "hierplan.node.status") == root_status
    assert workflow.status.status_code.name == span_status


@pytest.mark.anyio
async def test_a_paused_run_s_spans_say_paused_as_the_record_does(tmp_path: Path) -> None:
    async def defer_the_report(plan: Plan, ctx: GateContext) -> Approve | Defer:
        return Defer(by="test") if ctx.step is not None and ctx.step.id == "report" else Approve()

    telemetry = Telemetry()
    result = await hierplan.run(
        instruments=[telemetry.tracing()],
        approver=CallbackApprover(defer_the_report),
        checkpoint_dir=tmp_path,
        **ScriptedRun().run_options(),
    )
    assert result.status == "paused"
    statuses = {n.path: n.status for n in result.nodes()}
    assert statuses["1"] == statuses["1.2"] == "paused"
    agents = [s for s in telemetry.finished() if s.name.startswith("invoke_agent")]
    assert agents
    for span in agents:
        assert _attr(span, "hierplan.node.status") == statuses[_attr(span, "hierplan.node.path")]
        assert span.status.status_code.name == "UNSET", span.name
    (workflow,) = [s for s in telemetry.finished() if s.parent is None]
    assert _attr(workflow, "hierplan.node.status") == "paused"
    assert _attr(workflow, "hierplan.run.status") == "paused"
    assert workflow.status.status_code.name == "UNSET"


class BudgetReserved(RunEvent):
    """Stands in for an event type another part of hierplan may add (budgets)."""

    type: Literal["budget_reserved"] = "budget_reserved"
    usd: float
    tokens: int


class _Reserving:
    """A model wrapper that emits a budget-like event before each call, as budgets would."""

    def __init__(self, inner: Model, node: NodeView) -> None:
        self.inner = inner
        self.node = node
        self.name, self.provider = inner.name, inner.provider
        self.priced_as, self.simulated = inner.priced_as, inner.simulated

    async def request(self, request: ModelRequest) -> ModelResponse:
        run = self.node.run
        run.bus.emit(BudgetReserved(run_id=run.run_id, path=self.node.path, usd=0.25, tokens=77))
        return await self.inner.request(request)


class EventSource(Instrument):
    """Emits a budget-like event per model call, and events for paths without an open span."""

    def wrap_model(self, model: Model, node: NodeView) -> Model:
        return _Reserving(model, node)

    def run_scope(self, run: RunView) -> AbstractAsyncContextManager[None]:
        @asynccontextmanager
        async def scope() -> AsyncIterator[None]:
            yield
            # the root's span has ended; the event goes to the workflow span
            run.bus.emit(BudgetReserved(run_id=run.run_id, path="1.9.9", usd=1.0, tokens=1))

        return scope()

    def node_scope(self, node: NodeView) -> AbstractAsyncContextManager[None]:
        @asynccontextmanager
        async def scope() -> AsyncIterator[None]:
            if node.path == "1.1":
                # a node that never ran: the event goes to its nearest open ancestor (1.1)
                run = node.run
                run.bus.emit(BudgetReserved(run_id=run.run_id, path="1.1.7", usd=0.5, tokens=5))
            yield

        return scope()


@pytest.mark.anyio
async def test_any_bus_event_lands_on_the_span_of_its_node() -> None:
    telemetry = Telemetry()
    scripted = ScriptedRun()
    # Tracing opens its scopes first, so the event source's scopes run inside them.
    instruments = [telemetry.tracing(), EventSource()]
    result = await hierplan.run(instruments=instruments, **scripted.run_options())
    assert result.status == "succeeded"
    spans = telemetry.finished()

    def events_of(span: ReadableSpan) -> list[dict[str, Any]]:
        return [
            dict(e.attributes or {}) for e in span.events if e.name == "hierplan.budget_reserved"
        ]

    agents = {_attr(s, "hierplan.node.path"): s for s in spans if s.name.startswith("invoke_agent")}
    calls_per_node = {n.path: len(n.calls) for n in result.nodes()}
    for path, span in agents.items():
        own = [e for e in events_of(span) if e["hierplan.node.path"] == path]
        assert len(own) == calls_per_node[path], path
        for event in own:
            assert event["hierplan.usd"] == 0.25 and event["hierplan.tokens"] == 77
    orphan = [e for e in events_of(agents["1.1"]) if e["hierplan.node.path"] == "1.1.7"]
    assert orphan == [{"hierplan.node.path": "1.1.7", "hierplan.usd": 0.5, "hierplan.tokens": 5}]
    (workflow,) = [s for s in spans if s.parent is None]
    assert [e["hierplan.node.path"] for e in events_of(workflow)] == ["1.9.9"]


SECRET = "sk-ant-api03-abcdefghijklmnopqrstuvwxyz0123456789"


@pytest.mark.anyio
async def test_content_is_recorded_only_on_opt_in_and_secrets_never() -> None:
    for capture in (False, True):
        telemetry = Telemetry()
        scripted = ScriptedRun()
        options = scripted.run_options()
        options["goal"] = options["goal"].model_copy(
            update={"goal": f"Sum and report (key {SECRET})"}
        )
        await hierplan.run(instruments=[telemetry.tracing(capture_content=capture)], **options)
        spans = telemetry.finished()
        text = json.dumps([dict(s.attributes or {}) for s in spans], default=str)
        text += json.dumps([dict(e.attributes or {}) for s in spans for e in s.events], default=str)
        assert SECRET not in text
        chats = [s for s in spans if s.kind.name == "CLIENT"]
        tools = [s for s in spans if s.name.startswith("execute_tool")]
        if not capture:
            assert "Sum and report" not in text
            assert all("gen_ai.input.messages" not in (s.attributes or {}) for s in chats)
            continue
        assert "[REDACTED]" in _attr(spans[-1], "hierplan.goal")
        for chat in chats:
            messages = json.loads(_attr(chat, "gen_ai.input.messages"))
            assert messages[0]["role"] == "user"
            assert json.loads(_attr(chat, "gen_ai.system_instructions"))[0]["type"] == "text"
        answered = [c for c in chats if "gen_ai.output.messages" in (c.attributes or {})]
        outputs = [json.loads(_attr(c, "gen_ai.output.messages"))[0] for c in answered]
        calls = [p for o in outputs for p in o["parts"] if p["type"] == "tool_call"]
        assert calls == [
            {"type": "tool_call", "id": "call-1", "name": "add", "arguments": {"a": 2, "b": 3}}
        ]
        add = [t for t in tools if _attr(t, "gen_ai.tool.call.id") == "call-1"]
        assert json.loads(_attr(add[0], "gen_ai.tool.call.arguments")) == {"a": 2, "b": 3}


class _Lookup(Tool):
    """A tool whose argument errors quote the value, as JSON-schema validation (MCP tools) does."""

    def __init__(self) -> None:
        schema = {"type": "object", "properties": {"count": {"type": "integer"}}}
        super().__init__("lookup", "Look a number up.", schema)

    def validate(self, arguments: Mapping[str, Any]) -> Mapping[str, Any]:
        if not isinstance(arguments.get("count"), int):
            raise ToolArgsError(f"count: {arguments.get('count')!r} is not of type 'integer'")
        return arguments

    async def invoke(self, arguments: Mapping[str, Any]) -> Any:
        return arguments["count"]


@pytest.mark.anyio
async def test_lists_of_text_in_span_events_are_redacted_and_cut() -> None:
    """The gate's problems quote the plan's arguments: a key in them stays out of the trace."""

    def plan(count: object) -> ModelResponse:
        step = Step(id="a", title="a", instruction="look up", tool="lookup", args={"count": count})
        return plan_response(Plan(goal="look up", steps=[step]))

    telemetry = Telemetry()
    model = ScriptedModel([plan(SECRET), plan("x" * 5000), plan(3)])
    result = await hierplan.run(
        "look up", model=model, tools=[_Lookup()], strategy="dag", instruments=[telemetry.tracing()]
    )
    assert result.status == "succeeded", result.error
    (root,) = [s for s in telemetry.finished() if s.name == "invoke_agent planner"]
    decided = [e.attributes or {} for e in root.events if e.name == "hierplan.plan_decided"]
    problems = [p for e in decided for p in cast(Sequence[str], e.get("hierplan.problems", ()))]
    assert len(problems) == 2 and all(isinstance(p, str) for p in problems)
    assert SECRET not in problems[0] and "[REDACTED]" in problems[0]
    assert len(problems[1]) == EVENT_TEXT_LIMIT


def test_redact_hides_key_shapes() -> None:
    assert redact(f"use {SECRET} now") == "use [REDACTED] now"
    assert redact("Authorization: Bearer abcdefghijklmnopqrstu") == "Authorization: [REDACTED]"
    assert redact('{"api_key": "abcd1234efgh"}') == '{"[REDACTED]"}'
    assert redact("AKIAABCDEFGHIJKLMNOP") == "[REDACTED]"
    assert redact("add 2 and 3, then skip the tokenizer") == "add 2 and 3, then skip the tokenizer"


def _points(telemetry: Telemetry, name: str) -> list[Any]:
    data = telemetry.reader.get_metrics_data()
    assert data is not None
    found = [
        metric
        for resource in data.resource_metrics
        for scope in resource.scope_metrics
        for metric in scope.metrics
        if metric.name == name
    ]
    assert len(found) == 1, name
    return list(found[0].data.data_points)


@pytest.mark.anyio
async def test_metrics_use_the_conventions_buckets_and_add_up() -> None:
    telemetry = Telemetry()
    result = await hierplan.run(instruments=[telemetry.tracing()], **ScriptedRun().run_options())
    totals = result.totals()
    tokens = _points(telemetry, "gen_ai.client.token.usage")
    assert all(isinstance(p, HistogramDataPoint) for p in tokens)
    assert {tuple(p.explicit_bounds) for p in tokens} == {tuple(float(b) for b in TOKEN_BUCKETS)}
    by_type: dict[str, float] = {}
    for point in tokens:
        kind = str(point.attributes["gen_ai.token.type"])
        by_type[kind] = by_type.get(kind, 0) + point.sum
        assert point.attributes["gen_ai.operation.name"] == "chat"
        assert point.attributes["gen_ai.provider.name"] == "function"
    assert by_type == {"input": totals["input_tokens"], "output": totals["output_tokens"]}
    durations = _points(telemetry, "gen_ai.client.operation.duration")
    assert {tuple(p.explicit_bounds) for p in durations} == {DURATION_BUCKETS}
    assert sum(p.count for p in durations) == totals["calls"]
    failed = [p for p in durations if "error.type" in p.attributes]
    assert [(p.attributes["error.type"], p.count) for p in failed] == [("ModelError", 1)]
    costs = _points(telemetry, "hierplan.client.cost")
    assert all(isinstance(p, NumberDataPoint) for p in costs)
    by_key = {
        (p.attributes["hierplan.node.depth"], p.attributes["hierplan.phase"]): p.value
        for p in costs
    }
    assert by_key == pytest.approx(
        {(1, "planning"): 0.00065, (2, "planning"): 0.00195, (3, "execution"): 0.0003575}
    )
    assert sum(by_key.values()) == pytest.approx(totals["cost_usd"])


@pytest.mark.anyio
async def test_one_instrument_traces_concurrent_runs_apart() -> None:
    telemetry = Telemetry()
    tracing = telemetry.tracing()
    results: dict[str, hierplan.RunResult] = {}

    async def one(run_id: str) -> None:
        options = ScriptedRun().run_options()
        options["goal"] = options["goal"].model_copy(update={"run_id": run_id})
        results[run_id] = await hierplan.run(instruments=[tracing], **options)

    async with anyio.create_task_group() as tg:
        tg.start_soon(one, "first")
        tg.start_soon(one, "second")
    spans = telemetry.finished()
    roots = [s for s in spans if s.parent is None]
    assert sorted(_attr(r, "hierplan.run_id") for r in roots) == ["first", "second"]
    for root in roots:
        trace_spans = [s for s in spans if s.context.trace_id == root.context.trace_id]
        check_cost_invariants(results[_attr(root, "hierplan.run_id")], trace_spans)


def test_without_an_sdk_tracing_records_nothing_and_runs_the_same() -> None:
    # No provider given and none registered: the API's no-op tracer, and the run is unchanged.
    scripted = ScriptedRun()
    result = hierplan.run_sync(instruments=[Tracing()], **scripted.run_options())
    assert result.status == "succeeded"
    assert result.totals()["calls"] == 7


class BusProbe(Instrument):
    """Notes whether anyone listens to the run's events while its nodes run."""

    def __init__(self) -> None:
        self.listened: set[bool] = set()

    def node_scope(self, node: NodeView) -> AbstractAsyncContextManager[None] | None:
        self.listened.add(node.run.bus.active)
        return None


@pytest.mark.parametrize(("sampler", "listened"), [(ALWAYS_OFF, False), (ALWAYS_ON, True)])
def test_a_trace_that_is_not_recorded_takes_no_events(sampler: Sampler, listened: bool) -> None:
    # Span events of a sampled-out trace go nowhere, so the run builds none for tracing.
    provider = TracerProvider(sampler=sampler)
    exporter = InMemorySpanExporter()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    probe = BusProbe()
    options = ScriptedRun().run_options()
    result = hierplan.run_sync(instruments=[Tracing(tracer_provider=provider), probe], **options)
    assert result.status == "succeeded"
    assert probe.listened == {listened}
    assert bool(exporter.get_finished_spans()) == listened


def test_tracing_alone_builds_no_events_its_spans_already_show(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Node starts and ends, model and tool calls are spans already: with tracing the only
    # listener the run does not build those events, and the span tree is whole without them.
    from hierplan.hierarchy import leaf as nodes

    def forbidden(*args: object, **kwargs: object) -> None:
        raise AssertionError("a span-like event was built for tracing")

    for name in ("NodeStarted", "NodeFinished"):
        monkeypatch.setattr(nodes, name, forbidden)
    provider = TracerProvider()
    exporter = InMemorySpanExporter()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    result = hierplan.run_sync(
        instruments=[Tracing(tracer_provider=provider)], **ScriptedRun().run_options()
    )
    assert result.status == "succeeded", result.error
    names = [span.name for span in exporter.get_finished_spans()]
    assert any(n.startswith("invoke_agent executor") for n in names), names
    assert any(n.startswith("chat ") for n in names), names


def test_tracing_sets_the_anthropic_switch_only_when_unset(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("ANTHROPIC_OPEN_TELEMETRY", raising=False)
    Tracing()
    assert os.environ["ANTHROPIC_OPEN_TELEMETRY"] == "false"
    monkeypatch.setenv("ANTHROPIC_OPEN_TELEMETRY", "true")
    Tracing()
    assert os.environ["ANTHROPIC_OPEN_TELEMETRY"] == "true"
    monkeypatch.delenv("ANTHROPIC_OPEN_TELEMETRY")
    Tracing(provider_spans=True)
    assert "ANTHROPIC_OPEN_TELEMETRY" not in os.environ


def test_a_tracing_bug_never_breaks_the_run(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    import hierplan.tracing.model as model_scope
    import hierplan.tracing.otel as otel
    import hierplan.tracing.scopes as scopes

    def broken(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("bug in tracing")

    monkeypatch.setattr(scopes, "node_rollups", broken)
    monkeypatch.setattr(otel, "attribute_value", broken)
    monkeypatch.setattr(model_scope.TracedCall, "_end_attributes", broken)
    telemetry = Telemetry()
    result = hierplan.run_sync(instruments=[telemetry.tracing()], **ScriptedRun().run_options())
    assert result.status == "succeeded"
    spans = telemetry.finished()
    assert len(spans) == 26  # every span still ended and was exported
    messages = {r.getMessage().split(" %")[0] for r in caplog.records}
    assert any("could not finish span" in m for m in messages)
    assert any("could not record event" in m for m in messages)
    assert any("could not record a model call" in m for m in messages)


def _benchmark() -> Any:
    import importlib.util

    path = Path(__file__).resolve().parent.parent / "benchmarks" / "tracing.py"
    spec = importlib.util.spec_from_file_location("tracing_benchmark", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_benchmark_floor_replays_the_very_spans_of_a_traced_run() -> None:
    bench = _benchmark()
    shape = anyio.run(bench.capture, 5)
    replayed = Telemetry()
    bench.replay(replayed.tracer_provider.get_tracer("floor"), shape)
    telemetry = Telemetry()
    result = hierplan.run_sync(instruments=[telemetry.tracing()], **bench._options(5))
    assert result.status == "succeeded"
    tree = _without_run_id(span_tree(telemetry.finished()))
    assert _without_run_id(span_tree(replayed.finished())) == tree
    leaves = tree["children"][0]["children"][1:]  # after the root's planning round
    assert [leaf["name"] for leaf in leaves] == ["invoke_agent executor"] * 5
    assert [[c["name"] for c in leaf["children"]] for leaf in leaves] == [["execute_tool noop"]] * 5


def _without_run_id(tree: dict[str, Any]) -> dict[str, Any]:
    """``tree`` without what names the run (each run has an id of its own)."""
    named = {"hierplan.run_id", "gen_ai.agent.id"}
    attributes = {k: v for k, v in tree["attributes"].items() if k not in named}
    children = [_without_run_id(c) for c in tree.get("children", [])]
    return {**tree, "attributes": attributes, "children": children}
