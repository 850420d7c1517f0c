"""Cancelling a run from outside: prompt, complete, and the record keeps what finished."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import anyio
import anyio.lowlevel
import pytest
from capitals import CapitalsOracle, goal_for, local_tools
from eventcheck import check_events
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import hierplan
from hierplan.hierarchy.events import RunEvent
from hierplan.hierarchy.record import RunResult

GROUPS = [["france", "japan"], ["peru", "chile"]]
TERMINAL = {"succeeded", "partial", "failed", "cancelled", "rejected", "budget_exhausted"}


def _start(delay_s: float, **options: object) -> hierplan.RunHandle:
    return hierplan.start(
        goal_for(GROUPS),
        oracle=CapitalsOracle(),
        tools=local_tools(delay_s),
        sim_profile="ideal",
        sim_latency_scale=0,
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


async def _cancel_at(cut: int, delay_s: float) -> tuple[bool, RunResult, list[RunEvent], float]:
    """Run, cancel once the consumer has read ``cut`` events; how long the cancel took."""
    cancelled = False
    took = 0.0
    async with _start(delay_s) as handle:
        events: list[RunEvent] = []
        async for event in handle.events():
            events.append(event)
            if len(events) == cut and not cancelled:
                t0 = time.perf_counter()
                cancelled = handle.cancel()
                result = await handle.result()
                took = time.perf_counter() - t0
        result = await handle.result()
    return cancelled, result, events, took


@settings(
    max_examples=100,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
@given(cut=st.integers(min_value=1, max_value=45), delay_ms=st.sampled_from([0, 1, 5]))
def test_cancel_at_any_moment(cut: int, delay_ms: int) -> None:
    """Whenever the cancel comes: no task leaks, every node ends, the events stay causal."""

    async def main() -> None:
        before = asyncio.all_tasks()
        cancelled, result, events, took = await _cancel_at(cut, delay_ms / 1000)
        await anyio.lowlevel.checkpoint()  # let finished tasks be collected
        leaked = asyncio.all_tasks() - before
        assert not leaked, leaked
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
        oracle=CapitalsOracle(),
        tools=[lookup, add],
        sim_profile="ideal",
        sim_latency_scale=0,
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
