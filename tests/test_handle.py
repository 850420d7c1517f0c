"""The run handle: an async event stream that never stalls the run, results, errors."""

from __future__ import annotations

from typing import Any

import anyio
import pytest
from capitals import CapitalsOracle, goal_for, local_tools
from eventcheck import check_events

import hierplan
from hierplan import ModelResponse, ScriptedModel
from hierplan.core.events import RunEvent, RunFinished
from hierplan.errors import UnexpectedModelCall, UnknownScenarioError, UserInputError

GROUPS = [["france", "japan"], ["peru"]]


def capitals(delay_s: float = 0.0, **options: Any) -> hierplan.RunHandle:
    """A handle on a three-level capitals run whose tools take ``delay_s`` each."""
    return hierplan.start(
        goal_for(GROUPS),
        tools=local_tools(delay_s),
        model=hierplan.Simulator(latency_scale=0, profile="ideal", oracle=CapitalsOracle()),
        **options,
    )


async def _collect(handle: hierplan.RunHandle, since: int = 0) -> list[RunEvent]:
    return [event async for event in handle.events(since)]


@pytest.mark.anyio
async def test_every_consumer_gets_every_event_in_order() -> None:
    got: dict[str, list[RunEvent]] = {}
    async with capitals(0.01) as handle:
        assert handle.status == "running"

        async def consume(name: str) -> None:
            got[name] = await _collect(handle)

        async with anyio.create_task_group() as tg:
            tg.start_soon(consume, "first")
            tg.start_soon(consume, "second")
        result = await handle.result()
    late = await _collect(handle)
    assert got["first"] == got["second"] == late
    assert len(late) == handle.event_count
    assert handle.done and handle.status == result.status == "succeeded"
    check_events(late, result)
    assert await _collect(handle, since=5) == late[5:]
    with pytest.raises(ValueError, match="since must be 0 or more"):
        handle.events(-1)


@pytest.mark.anyio
async def test_a_stalled_consumer_neither_slows_the_run_nor_loses_events() -> None:
    async with capitals(0.005) as handle:
        stream = handle.events()
        first = await stream.__anext__()
        assert first.type == "run_started"
        # The consumer stops reading; the run goes on to the end regardless.
        with anyio.fail_after(10):
            result = await handle.result()
        assert stream.position == 1
        rest = [event async for event in stream]
    events = [first, *rest]
    assert isinstance(events[-1], RunFinished)
    check_events(events, result)


@pytest.mark.anyio
async def test_bad_input_raises_on_entering_the_handle() -> None:
    with pytest.raises(UnknownScenarioError, match="unknown scenario 'nope'"):
        async with hierplan.start(scenario="nope"):
            pytest.fail("the block must not run")
    with pytest.raises(UserInputError, match="is free text"):
        async with hierplan.start("write me a poem"):
            pytest.fail("the block must not run")


@pytest.mark.anyio
async def test_an_error_in_the_block_cancels_the_run() -> None:
    handle = capitals(5.0)
    with pytest.raises(RuntimeError, match="consumer broke"):
        async with handle:
            async for event in handle.events():
                if event.type == "tool_called" or (
                    event.type == "node_started" and "." in event.path
                ):
                    raise RuntimeError("consumer broke")
    result = await handle.result()
    assert result.status == "cancelled"


@pytest.mark.anyio
async def test_cancel_before_the_run_starts() -> None:
    handle = capitals()
    assert handle.cancel()
    async with handle:
        events = await _collect(handle)
    result = await handle.result()
    assert result.status == "cancelled"
    assert result.tree.status == "cancelled"
    assert [e.type for e in events][-1] == "run_finished"
    assert handle.run_id == result.run_id


@pytest.mark.anyio
async def test_cancel_after_the_end_changes_nothing() -> None:
    async with capitals() as handle:
        result = await handle.result()
    assert not handle.cancel()
    assert result.status == "succeeded"


@pytest.mark.anyio
async def test_an_error_inside_the_run_reaches_the_caller() -> None:
    """A strict test double called past its script is a bug: it must not pass silently."""
    empty = ScriptedModel([])
    async with hierplan.start("anything", model=empty) as handle:
        with pytest.raises(UnexpectedModelCall):
            await handle.result()
    assert handle.status == "error"
    with pytest.raises(UnexpectedModelCall):
        async with hierplan.start("anything", model=ScriptedModel([])):
            pass  # the error was never retrieved: leaving the block raises it


@pytest.mark.anyio
async def test_run_id_is_known_before_the_run_and_used_by_it() -> None:
    handle = hierplan.start(
        hierplan.RunSpec(
            goal="anything",
            model=ScriptedModel([ModelResponse(text="not a plan")] * 2),
            run_id="abc",
        )
    )
    assert handle.run_id == "abc"
    async with handle:
        events = await _collect(handle)
    result = await handle.result()
    assert result.run_id == "abc" and {e.run_id for e in events} == {"abc"}
    assert result.status == "failed"
    check_events(events, result)


@pytest.mark.anyio
async def test_a_handle_used_before_its_block_says_how_to_use_it() -> None:
    handle = capitals()
    # Without the check result() waited for ever: the deadline turns that into a failure.
    with (
        anyio.fail_after(5),
        pytest.raises(RuntimeError, match=r"RunHandle.result\(\) was called before the run"),
    ):
        await handle.result()
    with pytest.raises(RuntimeError, match=r"async with hierplan.start\(...\) as handle"):
        handle.events()
    assert handle.status == "starting" and handle.event_count == 0
    async with handle:  # the refusals left the handle usable
        result = await handle.result()
    assert result.status == "succeeded"
    assert [e async for e in handle.events()][-1].type == "run_finished"
