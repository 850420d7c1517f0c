"""Shared pieces of the tracing tests: in-memory OpenTelemetry, a scripted three-level run, and
the normalised span tree."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

import hierplan
from hierplan import FunctionModel, ModelRequest, ModelResponse, ToolCall, Usage, tool
from hierplan.errors import ModelError, ToolArgsError
from hierplan.tracing.otel import Tracing

PRICED_AS = "openai:gpt-5-mini"

# Attributes whose values depend on timing or on the price table's date, not on what the run
# did (tests check them on their own).
VOLATILE = frozenset({"hierplan.peak_concurrent_leaves", "hierplan.price_table"})


@dataclass
class Telemetry:
    """An SDK tracer and meter provider that keep everything in memory."""

    spans: InMemorySpanExporter = field(default_factory=InMemorySpanExporter)
    reader: InMemoryMetricReader = field(default_factory=InMemoryMetricReader)

    def __post_init__(self) -> None:
        self.tracer_provider = TracerProvider()
        self.tracer_provider.add_span_processor(SimpleSpanProcessor(self.spans))
        self.meter_provider = MeterProvider(metric_readers=[self.reader])

    def tracing(self, **options: Any) -> Tracing:
        """A :class:`Tracing` instrument on these providers."""
        return Tracing(
            tracer_provider=self.tracer_provider, meter_provider=self.meter_provider, **options
        )

    def finished(self) -> list[ReadableSpan]:
        """Every finished span."""
        return list(self.spans.get_finished_spans())


# -- the scripted three-level run ---------------------------------------------------------------


def _plan(goal: str, *steps: dict[str, Any]) -> dict[str, Any]:
    return {"goal": goal, "steps": list(steps)}


ROOT_PLAN = _plan(
    "Sum and report",
    {"id": "gather", "title": "Gather", "instruction": "Gather the numbers", "kind": "subgoal"},
    {
        "id": "report",
        "title": "Report",
        "instruction": "Report the sum",
        "kind": "subgoal",
        "depends_on": ["gather"],
    },
)
GATHER_PLAN = _plan(
    "Gather the numbers",
    {
        "id": "x",
        "title": "Add",
        "instruction": "Add 1 and 2",
        "tool": "add",
        "args": {"a": 1, "b": 2},
    },
    {"id": "y", "title": "Ask", "instruction": "Add 2 and 3 with the add tool", "tool": "add"},
    {
        "id": "z",
        "title": "Flaky",
        "instruction": "Call the flaky tool",
        "tool": "flaky",
        "args": {},
    },
)
REPORT_PLAN = _plan(
    "Report the sum",
    {
        "id": "r",
        "title": "Broken",
        "instruction": "Call the broken tool",
        "tool": "broken",
        "args": {},
    },
    {
        "id": "after",
        "title": "After",
        "instruction": "Add 1 and 1",
        "tool": "add",
        "args": {"a": 1, "b": 1},
        "depends_on": ["r"],
    },
)
REPORT_REPLAN = _plan(
    "Report the sum",
    {
        "id": "r2",
        "title": "Add",
        "instruction": "Add 3 and 5",
        "tool": "add",
        "args": {"a": 3, "b": 5},
    },
)


class ScriptedRun:
    """Model and tools of a deterministic three-level hierarchical run.

    Root ``1`` plans two sub-goals; ``1.1`` runs a direct tool step, an LLM executor step whose
    first model attempt fails with a retryable error (a model retry) and which then calls a tool,
    and a flaky tool step that succeeds on its second try (a step retry); ``1.2`` runs a broken
    tool, fails and replans, which drops the step that waited for it (node ``1.2.2`` never runs:
    it has a record, cancelled, but no span). Answers depend on the node path only, so
    concurrency cannot change them.
    """

    def __init__(self) -> None:
        self.calls: dict[str, int] = defaultdict(int)
        self.flaky_calls = 0
        self.model = FunctionModel(self.answer, name="test-model", priced_as=PRICED_AS)

    def answer(self, request: ModelRequest) -> ModelResponse:
        path = request.node_path
        self.calls[path] += 1
        n = self.calls[path]
        if request.phase == "planning":
            plans = {
                ("1", "plan"): ROOT_PLAN,
                ("1.1", "plan"): GATHER_PLAN,
                ("1.2", "plan"): REPORT_PLAN,
                ("1.2", "replan"): REPORT_REPLAN,
            }
            return ModelResponse(output=plans[(path, request.purpose)], usage=Usage(1000, 200))
        if path == "1.1.2" and n == 1:
            raise ModelError("overloaded", retryable=True, usage=Usage(300, 0))
        if path == "1.1.2" and n == 2:
            call = ToolCall("call-1", "add", {"a": 2, "b": 3})
            return ModelResponse(tool_calls=(call,), usage=Usage(400, 30, cached_input_tokens=100))
        if path == "1.1.2" and n == 3:
            return ModelResponse(text="5", usage=Usage(500, 10, reasoning_tokens=4))
        raise AssertionError(f"unexpected model call {n} at {path}: {request.purpose}")

    def tools(self) -> list[Any]:
        """The tools of the run."""

        @tool
        def add(a: int, b: int) -> int:
            """Add two integers."""
            return a + b

        @tool
        async def flaky() -> str:
            """Works the second time."""
            self.flaky_calls += 1
            if self.flaky_calls == 1:
                raise RuntimeError("temporary failure")
            return "ok"

        @tool
        async def broken() -> str:
            """Always fails."""
            raise ToolArgsError("broken tool")

        return [add, flaky, broken]

    def run_options(self) -> dict[str, Any]:
        """Keyword arguments of :func:`hierplan.run` for this run."""
        from hierplan import RunSettings, RunSpec

        return {
            "goal": RunSpec(
                goal="Sum and report",
                model=self.model,
                # The broken tool's step fails as the plan wrote it: the replan is what this
                # run shows, not a call decided again (tests/test_redecide.py).
                settings=RunSettings(retry_backoff_s=0, max_depth=3, redecide_tool_calls=False),
                run_id="scripted",
            ),
            "tools": self.tools(),
        }


# -- span trees -----------------------------------------------------------------------------------


def children_of(spans: Sequence[ReadableSpan]) -> dict[int | None, list[ReadableSpan]]:
    """Spans by their parent's span id (``None`` for roots)."""
    out: dict[int | None, list[ReadableSpan]] = defaultdict(list)
    for span in spans:
        out[span.parent.span_id if span.parent else None].append(span)
    return out


def _sort_key(span: ReadableSpan) -> tuple[str, int]:
    # Spans of one node start one after another; sibling nodes may start in any order, so they
    # are ordered by path.
    return (str((span.attributes or {}).get("hierplan.node.path", "")), span.start_time or 0)


def _value(value: Any) -> Any:
    if isinstance(value, float):
        return round(value, 10)
    if isinstance(value, tuple | list):
        return [_value(v) for v in value]
    return value


def normalise(span: ReadableSpan, index: dict[int | None, list[ReadableSpan]]) -> dict[str, Any]:
    """A span and its subtree without ids and times, children in a stable order."""
    assert span.context is not None
    attributes = {
        k: _value(v) for k, v in sorted((span.attributes or {}).items()) if k not in VOLATILE
    }
    node: dict[str, Any] = {
        "name": span.name,
        "kind": span.kind.name,
        "status": span.status.status_code.name,
        "attributes": attributes,
    }
    if span.events:
        node["events"] = [
            {"name": e.name, "attributes": {k: _value(v) for k, v in (e.attributes or {}).items()}}
            for e in span.events
        ]
    children = sorted(index.get(span.context.span_id, []), key=_sort_key)
    if children:
        node["children"] = [normalise(c, index) for c in children]
    return node


def span_tree(spans: Sequence[ReadableSpan]) -> dict[str, Any]:
    """The normalised tree of the one trace in ``spans``."""
    index = children_of(spans)
    roots = index[None]
    assert len(roots) == 1, [r.name for r in roots]
    return normalise(roots[0], index)


def descendants(
    span: ReadableSpan, index: dict[int | None, list[ReadableSpan]]
) -> Iterator[ReadableSpan]:
    """Every span below ``span``."""
    assert span.context is not None
    for child in index.get(span.context.span_id, []):
        yield child
        yield from descendants(child, index)


def ran(tree: dict[str, Any]) -> list[str]:
    """Paths of the nodes of a run.json tree that started. A pending node that a replan dropped
    or replaced never ran: it is in the record (cancelled) but has no span."""
    stack, out = [tree], []
    while stack:
        node = stack.pop()
        stack.extend(node["children"])
        if node["started_at"] is not None:
            out.append(node["path"])
    return out


def check_cost_invariants(result: hierplan.RunResult, spans: list[ReadableSpan]) -> None:
    """Chat spans add up to the run record; every rollup equals the chat spans below it."""
    index = children_of(spans)
    chats = [s for s in spans if _attr(s, "gen_ai.operation.name") == "chat"]
    totals = result.totals()
    assert len(chats) == totals["calls"]
    assert sum(_chat_cost(s) for s in chats) == pytest.approx(totals["cost_usd"], abs=1e-12)
    assert sum(_attr(s, "gen_ai.usage.input_tokens") for s in chats) == totals["input_tokens"]
    assert sum(_attr(s, "gen_ai.usage.output_tokens") for s in chats) == totals["output_tokens"]
    # cost is on chat spans only, so a backend summing the trace counts each call once
    for span in spans:
        if span not in chats:
            assert "gen_ai.usage.cost" not in (span.attributes or {}), span.name
            assert "llm.cost.total" not in (span.attributes or {}), span.name
            assert "gen_ai.usage.input_tokens" not in (span.attributes or {}), span.name
    # every rollup equals the chat spans below it, and the record's subtree
    rolled = [s for s in spans if "gen_ai.aggregated_usage.cost" in (s.attributes or {})]
    assert rolled
    for span in rolled:
        below = [d for d in descendants(span, index) if d in chats]
        assert _attr(span, "gen_ai.aggregated_usage.cost") == pytest.approx(
            sum(_chat_cost(d) for d in below), abs=1e-12
        ), span.name
        assert _attr(span, "gen_ai.aggregated_usage.input_tokens") == sum(
            _attr(d, "gen_ai.usage.input_tokens") for d in below
        )
        assert _attr(span, "hierplan.calls") == len(below)
        if _attr(span, "gen_ai.operation.name") == "invoke_agent":
            node = result.tree.find(_attr(span, "hierplan.node.path"))
            assert _attr(span, "hierplan.cost.subtree_usd") == node.subtree_cost_usd
            assert _attr(span, "hierplan.cost.node_usd") == node.cost_usd
    workflow = index[None][0]
    levels = result.levels()
    assert [level["depth"] for level in levels] == list(range(1, len(levels) + 1))
    assert list(_attr(workflow, "hierplan.level.cost_usd")) == pytest.approx(
        [level["cost_usd"] for level in levels], abs=1e-12
    )
    assert list(_attr(workflow, "hierplan.level.nodes")) == [level["nodes"] for level in levels]
    assert list(_attr(workflow, "hierplan.level.input_tokens")) == [
        level["input_tokens"] for level in levels
    ]


def _chat_cost(span: ReadableSpan) -> float:
    return float((span.attributes or {}).get("gen_ai.usage.cost", 0.0))  # type: ignore[arg-type]


def _attr(span: ReadableSpan, key: str) -> Any:
    return (span.attributes or {})[key]
