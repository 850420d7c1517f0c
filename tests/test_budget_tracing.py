"""Budgets in the trace: budget events on the spans of their nodes, budget figures on agent
spans, and the cost invariants unchanged."""

from __future__ import annotations

from typing import Any

import anyio
import pytest
from opentelemetry.sdk.trace import ReadableSpan
from tracing_support import ScriptedRun, Telemetry, check_cost_invariants

import hierplan
from hierplan import FunctionModel, ModelRequest, ModelResponse, Usage

pytestmark = pytest.mark.anyio


def _attrs(span: ReadableSpan) -> dict[str, Any]:
    return dict(span.attributes or {})


async def test_budget_events_and_figures_reach_the_trace() -> None:
    telemetry = Telemetry()
    scripted = ScriptedRun()
    result = await hierplan.run(
        instruments=[telemetry.tracing()],
        budget={"usd": 1.0, "tokens": 1_000_000},
        **scripted.run_options(),
    )
    assert result.status == "succeeded", result.error
    spans = telemetry.finished()
    check_cost_invariants(result, spans)
    agents = {
        _attrs(s)["hierplan.node.path"]: s for s in spans if s.name.startswith("invoke_agent")
    }
    for node in result.nodes():
        if node.path not in agents:
            continue  # a node that never ran has no span
        span = agents[node.path]
        for kind in ("budget_reserved", "budget_settled"):
            events = [
                e
                for e in span.events
                if e.name == f"hierplan.{kind}"
                and (e.attributes or {}).get("hierplan.node.path") == node.path
            ]
            assert len(events) == len(node.calls), (node.path, kind)
        if node.budget is not None:
            attrs = _attrs(span)
            assert attrs["hierplan.budget.spent_tokens"] == node.budget["spent_tokens"]
            assert attrs["hierplan.budget.limit_usd"] == pytest.approx(node.budget["limit_usd"])
    assert result.budget is not None
    assert result.budget["spent"]["tokens"] == sum(
        c.usage.total_tokens for n in result.nodes() for c in n.calls
    )


async def test_a_call_cut_short_by_its_step_deadline_is_traced_as_recorded_and_settled() -> None:
    """A call past its step's deadline may have been billed: its chat span, its record and its
    budget settlement all count it at what it held, so the trace still adds up."""
    plan = {"goal": "g", "steps": [{"id": "slow", "title": "Slow", "instruction": "think"}]}

    async def answer(request: ModelRequest) -> ModelResponse:
        if request.phase == "planning":
            return ModelResponse(output=plan, usage=Usage(1000, 200))
        await anyio.sleep(5)  # past the step's deadline
        raise AssertionError("unreachable")

    telemetry = Telemetry()
    result = await hierplan.run(
        "g",
        strategy="plan-execute",
        model=FunctionModel(answer, name="test-model", priced_as="openai:gpt-5-mini"),
        settings=hierplan.RunSettings(step_timeout_s=0.2, max_retries=0, max_replans=0),
        instruments=[telemetry.tracing()],
        budget={"tokens": 100_000},
    )
    spans = telemetry.finished()
    check_cost_invariants(result, spans)
    (cut,) = [c for n in result.nodes() for c in n.calls if "cut_short" in c.flags]
    assert not cut.ok and cut.usage.output_tokens == hierplan.RunSettings().executor_max_tokens
    (chat,) = [s for s in spans if _attrs(s).get("hierplan.flags") == ("cut_short",)]
    assert _attrs(chat)["gen_ai.usage.input_tokens"] == cut.usage.input_tokens
    assert _attrs(chat)["gen_ai.usage.output_tokens"] == cut.usage.output_tokens
    assert result.budget is not None
    assert result.budget["spent"]["tokens"] == 1200 + cut.usage.total_tokens
