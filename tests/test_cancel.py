"""Cancelling a run from outside: prompt, complete, and the record keeps what finished."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import anyio
import anyio.lowlevel
import pytest
from capitals import CapitalsOracle, goal_for, local_tools
from eventcheck import check_events
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import hierplan
from hierplan import Budget, BudgetInstrument, LocalLedger, NoiseProfile
from hierplan.core.events import BudgetReserved, BudgetSettled, ModelCalled, RunEvent
from hierplan.records import RunResult

GROUPS = [["france", "japan"], ["peru", "chile"]]
TERMINAL = {"succeeded", "partial", "failed", "cancelled", "rejected", "budget_exhausted"}


# The oracle's answers without noise, but taking time: a cancel can land inside a model call.
SLOW_IDEAL = NoiseProfile(name="slow-ideal", latency_median_s=0.01)


def _start(delay_s: float, latency: float = 0.0, **options: Any) -> hierplan.RunHandle:
    """A capitals run; tools take ``delay_s``, model calls ``latency`` x 10 ms."""
    return hierplan.start(
        goal_for(GROUPS),
        tools=local_tools(delay_s),
        model=hierplan.Simulator(
            latency_scale=latency, profile=SLOW_IDEAL, oracle=CapitalsOracle()
        ),
        **options,
    )


def _check_cancelled_record(result: RunResult, events: list[RunEvent]) -> None:
    assert result.status == "cancelled"
    assert result.tree.status == "cancelled"
    assert result.error == "cancelled by the caller"
    assert not result.answer_complete
    for node in result.nodes():
        assert node.status in TERMINAL, (node.path, node.status)
        if node.status == "succeeded":
            assert node.output, node.path  # what finished keeps its output
    check_events(events, result)


async def _cancel_at(
    cut: int,
    delay_s: float,
    latency: float = 0.0,
    ledger: LocalLedger | None = None,
    exact: bool = False,
) -> tuple[bool, RunResult, list[RunEvent], float]:
    """Run under a budget on ``ledger`` and cancel at the ``cut``-th event: from a listener at
    the moment it happens (``exact``), or from a consumer once it has read it (later, as the
    consumer lags). Returns whether the cancel took, the record, the events and how long the
    cancel took."""
    cancelled = False
    took = 0.0
    handles: list[hierplan.RunHandle] = []
    seen = 0
    started = 0.0

    def listener(event: RunEvent) -> None:
        nonlocal seen, cancelled, started
        seen += 1
        if exact and seen == cut:
            started = time.perf_counter()
            cancelled = handles[0].cancel()

    budget = BudgetInstrument(Budget(tokens=100_000, usd=1.0), ledger=ledger or LocalLedger())
    handle = _start(delay_s, latency, instruments=[budget], listeners=[listener])
    handles.append(handle)
    async with handle:
        events: list[RunEvent] = []
        async for event in handle.events():
            events.append(event)
            if not exact and len(events) == cut and not cancelled:
                started = time.perf_counter()
                cancelled = handle.cancel()
            if cancelled and not took:
                await handle.result()
                took = time.perf_counter() - started
        result = await handle.result()
    return cancelled, result, events, took


@settings(
    max_examples=100,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
@given(
    cut=st.integers(min_value=1, max_value=70),
    delay_ms=st.sampled_from([0, 1, 5]),
    latency=st.sampled_from([0.0, 0.2, 1.0]),
    exact=st.booleans(),
)
def test_cancel_at_any_moment(cut: int, delay_ms: int, latency: float, exact: bool) -> None:
    """Whenever the cancel comes: no task leaks, no reservation is left outstanding, every
    node ends, the events stay causal (every reservation settled or released)."""

    async def main() -> None:
        before = asyncio.all_tasks()
        ledger = LocalLedger()
        cancelled, result, events, took = await _cancel_at(
            cut, delay_ms / 1000, latency, ledger, exact
        )
        await anyio.lowlevel.checkpoint()  # let finished tasks be collected
        leaked = asyncio.all_tasks() - before
        assert not leaked, leaked
        outstanding = await ledger.outstanding()
        assert (outstanding.reservations, outstanding.tokens, outstanding.pico) == (0, 0, 0)
        assert outstanding.accounts == 0
        if cancelled:
            _check_cancelled_record(result, events)
            assert took < 1.0
        else:  # the cancel came after the last node finished: nothing changes
            assert result.status == "succeeded"
            check_events(events, result)

    anyio.run(main, backend="asyncio")


@pytest.mark.anyio
async def test_cancel_is_prompt_while_tools_are_slow() -> None:
    async with _start(30.0) as handle:
        async for event in handle.events():
            if event.type == "node_started" and event.path.count(".") == 2:
                break
        t0 = time.perf_counter()
        assert handle.cancel()
        result = await handle.result()
        took = time.perf_counter() - t0
    assert took < 0.5
    assert result.status == "cancelled"
    leaves = [n for n in result.nodes() if n.depth == 3]
    assert leaves and all(n.status == "cancelled" for n in leaves)


@pytest.mark.anyio
async def test_the_cancelled_record_keeps_what_finished(tmp_path: Path) -> None:
    """The sum step is done when the slow lookups are cancelled: the record keeps its result."""

    @hierplan.tool
    async def lookup(country: str) -> str:
        """The capital of a country (never answers in time)."""
        await anyio.sleep(30)
        return "?"

    @hierplan.tool
    async def add(a: int, b: int) -> int:
        """Add two integers."""
        return a + b

    async with hierplan.start(
        goal_for(GROUPS, 20, 22),
        tools=[lookup, add],
        model=hierplan.Simulator(latency_scale=0, profile="ideal", oracle=CapitalsOracle()),
    ) as handle:
        events: list[RunEvent] = []
        async for event in handle.events():
            events.append(event)
            if event.type == "node_finished" and getattr(event, "status", "") == "succeeded":
                handle.cancel()
        result = await handle.result()
    _check_cancelled_record(result, events)
    summed = next(n for n in result.nodes() if n.step_id == "sum")
    assert summed.status == "succeeded" and summed.output == "42"
    again = RunResult.load(result.write(tmp_path / "run.json"))
    assert again.status == "cancelled"
    assert again.tree.find(summed.path).output == "42"


@pytest.mark.anyio
async def test_a_caller_deadline_around_the_block_cancels_the_run() -> None:
    before = asyncio.all_tasks()
    handle = _start(30.0)
    with anyio.move_on_after(0.2) as scope:
        async with handle:
            await handle.result()
    assert scope.cancelled_caught
    result = await handle.result()
    assert result.status == "cancelled"
    assert asyncio.all_tasks() == before


@pytest.mark.anyio
async def test_a_cancel_during_a_model_call_settles_it_at_its_reservation() -> None:
    """Cancelled right after the root's planning call reserved its worst case: the provider
    may have billed the request, so the run's spend counts what the call held."""
    ledger = LocalLedger()
    cancelled, result, events, _ = await _cancel_at(3, 0.0, 1.0, ledger, exact=True)
    assert cancelled and result.status == "cancelled"
    assert [e.type for e in events[:3]] == ["run_started", "node_started", "budget_reserved"]
    (reserved,) = [e for e in events if isinstance(e, BudgetReserved)]
    settled = [e for e in events if isinstance(e, BudgetSettled)]
    assert len(settled) == 1 and settled[0].flags == ["cut_short"]
    assert settled[0].tokens == reserved.tokens > 0
    assert not [e for e in events if isinstance(e, ModelCalled) and e.path == "1" and e.ok]
    outstanding = await ledger.outstanding()
    assert (outstanding.reservations, outstanding.tokens, outstanding.accounts) == (0, 0, 0)
    assert result.budget is not None and result.budget["spent"]["tokens"] == reserved.tokens
    (call,) = result.tree.calls
    assert (call.ok, call.flags, call.usage.total_tokens) == (False, ["cut_short"], reserved.tokens)


def _stray_cancel_plan() -> dict[str, Any]:
    return {
        "goal": "g",
        "steps": [
            {"id": "a", "title": "a", "instruction": "a", "tool": "waits", "args": {"key": "k"}},
            {"id": "b", "title": "b", "instruction": "b", "depends_on": ["a"]},
        ],
    }


async def _cancelled_elsewhere() -> None:
    """Await a task that something else cancelled: its CancelledError reaches the awaiter,
    though nothing cancelled the awaiter itself."""
    inner = asyncio.get_running_loop().create_future()
    inner.cancel()
    await inner


@pytest.mark.anyio
@pytest.mark.parametrize("strategy", ["dag", "hierarchical", "replan"])
async def test_a_tool_raising_a_stray_cancellation_fails_its_step_with_an_error(
    strategy: str,
) -> None:
    """A task group drops a cancellation that leaves a task: a tool's stray one used to end
    its step with no error at all (or leave the run as a bare CancelledError)."""
    from hierplan import ScriptedModel, tool
    from hierplan.models.scripted import plan_response

    @tool
    async def waits(key: str) -> str:
        """Wait for a value that another task computes."""
        await _cancelled_elsewhere()
        return key

    model = ScriptedModel([plan_response(_stray_cancel_plan())] * 3)
    result = await hierplan.run(
        "g",
        model=model,
        tools=[waits],
        strategy=strategy,
        settings=hierplan.RunSettings(max_retries=0, max_replans=0),
    )
    assert result.status == "failed"
    step = next(n for n in result.nodes() if n.step_id == "a")
    assert step.status == "failed"
    assert step.error is not None and "tool 'waits' raised CancelledError though nothing" in (
        step.error
    )
    assert step.tool_calls[0].error is not None


@pytest.mark.anyio
async def test_a_model_raising_a_stray_cancellation_fails_the_call_and_the_budget_adds_up() -> None:
    from hierplan import FunctionModel, ModelRequest, ModelResponse
    from hierplan.models.scripted import plan_response

    plan = {"goal": "g", "steps": [{"id": "a", "title": "a", "instruction": "a"}]}

    async def respond(request: ModelRequest) -> ModelResponse:
        if request.phase == "planning":
            return plan_response(plan)
        await _cancelled_elsewhere()
        raise AssertionError("not reached")

    result = await hierplan.run(
        "g",
        model=FunctionModel(respond, priced_as="openai:gpt-5-mini"),
        strategy="dag",
        settings=hierplan.RunSettings(max_retries=0, max_replans=0),
        budget={"usd": 1.0},
    )
    assert result.status == "failed"
    step = result.tree.children[0]
    assert step.error is not None and "raised CancelledError though nothing cancelled" in step.error
    assert step.calls[0].flags == ["cut_short"]  # counted as its budget settled it
    assert result.budget is not None
    assert result.budget["spent"]["tokens"] == sum(
        c.usage.total_tokens for n in result.nodes() for c in n.calls
    )
