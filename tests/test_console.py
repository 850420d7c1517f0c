"""The display of ``hierplan run``: its progress line and the events it takes."""

from __future__ import annotations

import io

import pytest
from rich.console import Console

import hierplan
from hierplan.core.events import EVENT_TYPES, ModelCalled, NodeFinished, NodeStarted, ignored_by
from hierplan.models.scripted import ScriptedModel, plan_response, text_response
from hierplan.view.console import RunConsole


def _drawn(display: RunConsole) -> str:
    """The progress line as the display would draw it now."""
    drawn = io.StringIO()
    Console(file=drawn, width=120, color_system=None).print(display.progress.get_renderable())
    return drawn.getvalue()


def _called(path: str, cost: float) -> ModelCalled:
    return ModelCalled(
        path=path,
        model="m",
        phase="execution",
        input_tokens=10,
        output_tokens=5,
        cost_usd=cost,
        duration_s=0.1,
    )


def test_the_progress_line_shows_the_figures_as_they_are_when_it_is_drawn() -> None:
    display = RunConsole(Console(file=io.StringIO(), color_system=None), simulated=True)
    try:
        display(NodeStarted(path="1", kind="planner", goal="g"))  # a planner is not a step
        for i in (1, 2, 3):
            display(NodeStarted(path=f"1.{i}", kind="executor", goal="g"))
        display(_called("1.1", 0.25))
        display(NodeFinished(path="1.1", status="succeeded"))
        first = _drawn(display)
        assert "1/3" in first and "running 2" in first and "$0.2500" in first, first
        # Events change the counters only; the next drawing shows them.
        display(_called("1.2", 0.5))
        display(NodeFinished(path="1.2", status="succeeded"))
        display(NodeFinished(path="1", status="succeeded"))
        second = _drawn(display)
        assert "2/3" in second and "running 1" in second and "$0.7500" in second, second
    finally:
        display.stop()


def test_the_progress_line_shows_what_the_run_budget_has_left() -> None:
    display = RunConsole(Console(file=io.StringIO(), color_system=None), simulated=True)
    try:
        # The root's start says what the run was given; its calls' figures, what it spent.
        display(NodeStarted(path="1", kind="planner", goal="g", limit_tokens=1_000, limit_usd=1.0))
        display(NodeStarted(path="1.1", kind="executor", goal="g", limit_tokens=500))
        display(_called("1.1", 0.25))
        assert "left $0.7500 / 985 tok" in _drawn(display)
        display(_called("1.1", 0.5))
        assert "left $0.2500 / 970 tok" in _drawn(display)
    finally:
        display.stop()
    # A USD-only budget shows USD only; without a budget nothing is left to show.
    usd_only = RunConsole(Console(file=io.StringIO(), color_system=None), simulated=True)
    unbudgeted = RunConsole(Console(file=io.StringIO(), color_system=None), simulated=True)
    try:
        usd_only(NodeStarted(path="1", kind="executor", goal="g", limit_usd=0.5))
        unbudgeted(NodeStarted(path="1", kind="executor", goal="g"))
        for shown in (usd_only, unbudgeted):
            shown(_called("1", 0.25))
        assert "left $0.2500" in _drawn(usd_only) and "tok" not in _drawn(usd_only)
        assert "left" not in _drawn(unbudgeted) and "$0.2500" in _drawn(unbudgeted)
    finally:
        usd_only.stop()
        unbudgeted.stop()


def test_the_display_takes_no_budget_events() -> None:
    display = RunConsole(Console(file=io.StringIO()), simulated=False)
    ignored = ignored_by(display)
    assert {"budget_reserved", "budget_settled"} <= ignored
    assert EVENT_TYPES - ignored == display.event_types


@pytest.mark.anyio
async def test_a_run_shown_by_the_display_counts_every_step() -> None:
    out = io.StringIO()
    display = RunConsole(Console(file=out, width=120, color_system=None), simulated=True)
    plan = {
        "goal": "two steps",
        "steps": [
            {"id": "a", "title": "a", "instruction": "say a"},
            {"id": "b", "title": "b", "instruction": "say b", "depends_on": ["a"]},
        ],
    }
    model = ScriptedModel([plan_response(plan), text_response("A"), text_response("B")])
    try:
        result = await hierplan.run(
            "two steps",
            strategy="dag",
            model=model,
            listeners=[display],
            budget={"tokens": 100_000},
        )
    finally:
        display.stop()
    assert result.status == "succeeded", result.error
    assert (display.started, display.finished, display.running) == (2, 2, 0)
    assert "plan for node 1 [SIMULATED]" in out.getvalue()
    assert "2/2" in _drawn(display)
    # What the run's budget has left: its limit less what its calls spent, as the record says.
    assert result.budget is not None
    left = 100_000 - result.budget["spent"]["tokens"]
    assert f"left {left:,} tok" in _drawn(display)
