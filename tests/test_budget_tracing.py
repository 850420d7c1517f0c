"""Budgets in the trace: budget events on the spans of their nodes, budget figures on agent
spans, and the cost invariants unchanged."""

from __future__ import annotations

from typing import Any

import pytest
from opentelemetry.sdk.trace import ReadableSpan
from tracing_support import ScriptedRun, Telemetry, check_cost_invariants

import hierplan

pytestmark = pytest.mark.anyio


def _attrs(span: ReadableSpan) -> dict[str, Any]:
    return dict(span.attributes or {})


async def test_budget_events_and_figures_reach_the_trace() -> None:
    telemetry = Telemetry()
    scripted = ScriptedRun()
    result = await hierplan.run(
        instruments=[telemetry.tracing()],
        budget_usd=1.0,
        budget_tokens=1_000_000,
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
