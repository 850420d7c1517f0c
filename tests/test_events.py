"""The typed event stream: complete, in causal order, adding up to the run record."""

from __future__ import annotations

import logging
import re
from collections import Counter
from collections.abc import AsyncIterator
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
from capitals import CapitalsOracle, goal_for, local_tools
from eventcheck import check_events

import hierplan
from hierplan import Budget, BudgetInstrument, Instrument, LocalLedger, Plan, ScriptedModel, Step
from hierplan.budgets import calls as budget_calls
from hierplan.core.events import (
    EVENT_TYPES,
    BudgetExhausted,
    EventBus,
    NodeStarted,
    PlanDecided,
    Replanned,
    RunEvent,
    RunFinished,
    ToolCalled,
    ignored_by,
    parse_event,
)
from hierplan.core.settings import RunSettings
from hierplan.core.views import NodeView
from hierplan.errors import ToolError, UserInputError
from hierplan.hierarchy import leaf as nodes
from hierplan.hierarchy import planning
from hierplan.models.base import ToolCall
from hierplan.models.scripted import plan_response
from hierplan.plans.plan import diff_plans

GROUPS = [["france", "japan"], ["peru", "chile"]]


async def _capitals(**options: Any) -> hierplan.RunResult:
    return await hierplan.run(
        goal_for(GROUPS),
        tools=local_tools(),
        model=hierplan.Simulator(latency_scale=0, profile="ideal", oracle=CapitalsOracle()),
        **options,
    )


async def _capitals_run(**options: Any) -> tuple[hierplan.RunResult, list[RunEvent]]:
    events: list[RunEvent] = []
    result = await _capitals(listeners=[events.append], **options)
    return result, events


@pytest.mark.anyio
async def test_three_level_run_events_are_complete_and_causal() -> None:
    result, events = await _capitals_run()
    assert result.status == "succeeded", result.error
    assert {n.depth for n in result.nodes()} == {1, 2, 3}
    check_events(events, result)
    kinds = Counter(e.type for e in events)
    # root + 2 group planners + 4 lookups + 1 sum; 3 plans, each approved
    assert kinds["node_started"] == kinds["node_finished"] == 8
    assert kinds["plan_proposed"] == 3
    assert [e.decision for e in events if isinstance(e, PlanDecided)] == ["approved"] * 3
    tools = Counter(e.tool for e in events if isinstance(e, ToolCalled))
    assert tools == {"lookup": 4, "add": 1}
    assert result.totals()["cost_usd"] > 0
    for country, capital in (("france", "Paris"), ("chile", "Santiago")):
        assert f"The capital of {country} is {capital}" in result.answer


@pytest.mark.anyio
async def test_scenario_run_events_with_noise_and_replans(tmp_path: Path) -> None:
    """The migration demo with the weak model's noise: it retries and replans."""
    events: list[RunEvent] = []
    result = await hierplan.run(
        scenario="data_migration",
        workdir=tmp_path,
        listeners=[events.append],
        model=hierplan.Simulator(latency_scale=0, profile="weak"),
    )
    check_events(events, result)
    replans = [e for e in events if isinstance(e, Replanned)]
    assert replans and any(e.type == "step_retried" for e in events)
    for replan in replans:
        node = result.tree.find(replan.path)
        version = node.plan_versions[replan.version - 1]
        assert version.decision == "approved"
        # the diff is against the plan that ran before (not a refused proposal in between)
        ran = [v for v in node.plan_versions[: replan.version - 1] if v.decision == "approved"]
        diff = diff_plans(ran[-1].plan, version.plan)
        assert (replan.added, replan.removed, replan.changed) == (
            list(diff.added),
            list(diff.removed),
            list(diff.changed),
        )


@hierplan.tool
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


@hierplan.tool
def broken(x: int) -> int:
    """Always fails."""
    raise RuntimeError(f"broken on {x}")


@pytest.mark.anyio
async def test_replanned_names_the_plan_that_replaced_the_running_one() -> None:
    def step(sid: str, *deps: str, **extra: Any) -> Step:
        return Step(id=sid, title=sid, instruction=sid, depends_on=list(deps), **extra)

    x = step("x", tool="add", args={"a": 1, "b": 1})
    first = Plan(goal="g", steps=[x, step("y", "x", tool="broken", args={"x": 0})])
    refused = Plan(goal="g", steps=[x, step("y2", "x", "nope", tool="add", args={"a": 1, "b": 1})])
    fixed = Plan(goal="g", steps=[x, step("y3", "x", tool="add", args={"a": "$x", "b": 1})])
    events: list[RunEvent] = []
    result = await hierplan.run(
        "g",
        model=ScriptedModel([plan_response(p) for p in (first, refused, fixed)]),
        strategy="dag",
        tools=[add, broken],
        listeners=[events.append],
        settings=RunSettings(retry_backoff_s=0, max_retries=0),
    )
    assert result.status == "succeeded" and result.answer == "3"
    (replanned,) = [e for e in events if isinstance(e, Replanned)]
    assert replanned.version == 3 and replanned.diff == "+1 -1 ~0 (added: y3; removed: y)"
    decided = [e for e in events if e.type == "plan_decided"]
    assert events.index(replanned) > events.index(decided[-1])  # once the gate approved it


@pytest.mark.anyio
async def test_runs_without_listeners_build_no_events(monkeypatch: pytest.MonkeyPatch) -> None:
    """The hot path pays nothing for events nobody reads."""

    def forbidden(*args: object, **kwargs: object) -> NodeStarted:
        raise AssertionError("an event was built although nobody listens")

    monkeypatch.setattr(nodes, "NodeStarted", forbidden)
    monkeypatch.setattr(planning, "PlanProposed", forbidden)
    result = await hierplan.run(
        goal_for(GROUPS),
        tools=local_tools(),
        model=hierplan.Simulator(latency_scale=0, profile="ideal", oracle=CapitalsOracle()),
    )
    assert result.status == "succeeded"
    with pytest.raises(AssertionError, match="an event was built"):
        await _capitals_run()


def test_events_read_back_from_json_and_reject_garbage() -> None:
    event = NodeStarted(run_id="r", path="1.2", kind="executor", goal="g", step_id="s")
    assert parse_event(event.model_dump_json()) == event
    assert parse_event(event.model_dump(mode="json")) == event
    with pytest.raises(ValueError, match="does not match any of the expected tags"):
        parse_event('{"type": "no_such_event"}')


def test_bus_delivers_in_order_and_unsubscribes() -> None:
    bus = EventBus("r")
    seen: list[str] = []
    assert not bus.active
    stop = bus.subscribe(lambda e: seen.append(e.path))
    assert bus.active
    for path in ("1", "1.1", "1.2"):
        bus.emit(NodeStarted(path=path, kind="planner", goal="g"))
    stop()
    bus.emit(NodeStarted(path="1.3", kind="planner", goal="g"))
    assert seen == ["1", "1.1", "1.2"]
    assert not bus.active


def test_a_listener_that_unsubscribes_while_an_event_is_delivered_costs_no_one_else_it() -> None:
    bus = EventBus("r")
    first: list[str] = []
    after: list[str] = []

    def once(event: RunEvent) -> None:
        first.append(event.path)
        stop_first()

    stop_first = bus.subscribe(once)
    bus.subscribe(lambda e: after.append(e.path))
    for path in ("1", "1.1", "1.2"):
        bus.emit(NodeStarted(path=path, kind="planner", goal="g"))
    assert first == ["1"] and after == ["1", "1.1", "1.2"]


def test_a_type_every_listener_ignores_is_not_wanted_nor_delivered() -> None:
    bus = EventBus("r")
    quiet: list[str] = []
    stop_quiet = bus.subscribe(lambda e: quiet.append(e.type), ignore=frozenset({"node_started"}))
    assert bus.active and not bus.wants("node_started") and bus.wants("plan_proposed")
    bus.emit(NodeStarted(path="1", kind="planner", goal="g"))
    assert quiet == []
    loud: list[str] = []
    stop_loud = bus.subscribe(lambda e: loud.append(e.type))
    assert bus.wants("node_started")  # one listener takes it: it is built again
    bus.emit(NodeStarted(path="1.1", kind="executor", goal="g"))
    assert (quiet, loud) == ([], ["node_started"])
    stop_loud()
    assert not bus.wants("node_started")
    stop_quiet()
    assert not bus.active and not bus.wants("plan_proposed")


class _OnlyFinished:
    """A listener that takes node_finished events only."""

    event_types = frozenset({"node_finished"})

    def __init__(self) -> None:
        self.seen: list[str] = []

    def __call__(self, event: RunEvent) -> None:
        self.seen.append(event.type)


@pytest.mark.anyio
async def test_a_listener_gets_only_its_event_types_and_the_others_are_not_built(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A listener's ``event_types`` is honoured by the run: the budget's per-call events, which
    it does not take, are never built (a progress display pays nothing for them)."""

    def forbidden(*args: object, **kwargs: object) -> RunEvent:
        raise AssertionError("an event was built that no listener takes")

    for name in ("BudgetReserved", "BudgetSettled"):
        monkeypatch.setattr(budget_calls, name, forbidden)
    monkeypatch.setattr(nodes, "NodeStarted", forbidden)
    monkeypatch.setattr(planning, "PlanProposed", forbidden)
    listener = _OnlyFinished()
    result = await _capitals(budget={"usd": 1.0}, listeners=[listener])
    assert result.status == "succeeded", result.error
    assert set(listener.seen) == {"node_finished"}
    assert len(listener.seen) == sum(1 for _ in result.tree.walk())
    # One listener that takes everything, and the same events are built and delivered again.
    everything: list[RunEvent] = []
    with pytest.raises(AssertionError, match="no listener takes"):
        await _capitals(budget={"usd": 1.0}, listeners=[_OnlyFinished(), everything.append])


def test_event_types_that_no_run_emits_are_refused_with_the_list_of_types() -> None:
    class Typo:
        event_types = frozenset({"node_finished", "node_finshed"})

        def __call__(self, event: RunEvent) -> None:
            return None

    with pytest.raises(UserInputError, match=r"'node_finshed'.*node_finished") as caught:
        ignored_by(Typo())
    assert "'node_finished'" not in str(caught.value).split(";")[0]
    one = Typo()
    one.event_types = "plan_decided"  # type: ignore[assignment]  # a single name, as a str
    assert ignored_by(one) == EVENT_TYPES - {"plan_decided"}
    assert ignored_by(lambda e: None) == frozenset()


def test_the_bus_honours_a_listeners_event_types_on_top_of_what_it_is_told_to_ignore() -> None:
    bus = EventBus("r")
    listener = _OnlyFinished()
    bus.subscribe(listener, ignore=frozenset({"node_finished"}))
    assert not bus.wants("node_finished") and not bus.wants("plan_proposed")
    other = _OnlyFinished()
    bus.subscribe(other)
    assert bus.wants("node_finished") and not bus.wants("node_started")
    bus.emit(NodeStarted(path="1", kind="planner", goal="g"))
    assert (listener.seen, other.seen) == ([], [])


@pytest.mark.anyio
async def test_a_run_refuses_a_listener_with_unknown_event_types_before_it_starts() -> None:
    class Typo:
        event_types = frozenset({"budget_reserve"})

        def __call__(self, event: RunEvent) -> None:
            raise AssertionError("no event may reach it")

    with pytest.raises(UserInputError, match="'budget_reserve'"):
        await _capitals(listeners=[Typo()])


@pytest.mark.anyio
async def test_budget_events_bracket_every_model_call() -> None:
    """Under a budget each call is reserved before it is made and settled when it returns
    (the budget wraps the model, so the settlement comes before the call's record)."""
    ledger = LocalLedger()
    result, events = await _capitals_run(
        instruments=[BudgetInstrument(Budget(tokens=50_000, usd=1.0), ledger=ledger)]
    )
    assert result.status == "succeeded", result.error
    check_events(events, result)  # with the settled amounts adding up to the run's cost
    calls: dict[str, str] = {}
    letter = {"budget_reserved": "r", "model_called": "m", "budget_settled": "s"}
    for event in events:
        if event.type in letter:
            calls[event.path] = calls.get(event.path, "") + letter[event.type]
    assert calls and all(re.fullmatch("(rsm)+", seq) for seq in calls.values()), calls
    assert result.budget is not None
    assert result.budget["spent"]["usd"] == pytest.approx(result.totals()["cost_usd"])
    outstanding = await ledger.outstanding()
    assert (outstanding.reservations, outstanding.tokens, outstanding.accounts) == (0, 0, 0)


@pytest.mark.anyio
async def test_a_budget_too_small_shows_in_exhausted_events() -> None:
    result, events = await _capitals_run(budget={"tokens": 2000})
    assert result.status == "partial"
    check_events(events, result)
    exhausted = [e for e in events if isinstance(e, BudgetExhausted)]
    assert exhausted
    for event in exhausted:
        assert event.available_tokens is not None
        assert event.needed_tokens > event.available_tokens
        assert result.tree.find(event.path).status == "budget_exhausted"


class _ToolScopes(Instrument):
    """Logs its tool scopes: entered, then left with the tool's outcome."""

    def __init__(self, name: str, log: list[str]) -> None:
        self.name = name
        self.log = log

    def tool_scope(self, node: NodeView, call: ToolCall) -> AbstractAsyncContextManager[None]:
        @asynccontextmanager
        async def scope() -> AsyncIterator[None]:
            self.log.append(f"{self.name} enter {call.name}")
            try:
                yield
            except ToolError:
                self.log.append(f"{self.name} saw failure")
                raise
            self.log.append(f"{self.name} exit")

        return scope()


@pytest.mark.parametrize("count", [1, 2])
def test_tool_scopes_wrap_each_tool_call_in_instrument_order(count: int) -> None:
    log: list[str] = []
    calls: list[str] = []

    @hierplan.tool
    def only(text: str) -> str:
        """Record a text, or fail on 'boom'."""
        if text == "boom":
            raise ValueError("boom")
        calls.append(text)
        return text

    plan = Plan(
        goal="g",
        steps=[
            Step(id="a", title="a", instruction="a", tool="only", args={"text": "hi"}),
            Step(id="b", title="b", instruction="b", tool="only", args={"text": "boom"}),
        ],
    )
    instruments = [_ToolScopes(name, log) for name in ("outer", "inner")[:count]]
    result = hierplan.run_sync(
        "g",
        model=ScriptedModel([plan_response(plan)]),
        tools=[only],
        strategy="plan-execute",
        settings=RunSettings(max_retries=0, concurrency=1, plan_concurrency=1),
        instruments=instruments,
    )
    assert result.status != "succeeded" and calls == ["hi"]
    ok = ["outer enter only", "inner enter only", "inner exit", "outer exit"]
    failed = ["outer enter only", "inner enter only", "inner saw failure", "outer saw failure"]
    if count == 1:
        ok = [e for e in ok if not e.startswith("inner")]
        failed = [e for e in failed if not e.startswith("inner")]
    assert log == ok + failed


@pytest.mark.anyio
async def test_a_run_that_raises_still_ends_its_events_with_run_finished() -> None:
    from hierplan.errors import ModelAuthError

    events: list[RunEvent] = []
    model = ScriptedModel([ModelAuthError("openai:gpt-5-mini: HTTP 401: key refused")])
    with pytest.raises(ModelAuthError):
        await hierplan.run("g", model=model, listeners=[events.append])
    last = events[-1]
    assert isinstance(last, RunFinished) and last.status == "error"
    assert last.error == "ModelAuthError: openai:gpt-5-mini: HTTP 401: key refused"
    assert [e.type for e in events].count("run_finished") == 1


_TWO_STEPS = {
    "goal": "g",
    "steps": [
        {"id": "a", "title": "a", "instruction": "do a"},
        {"id": "b", "title": "b", "instruction": "do b", "depends_on": ["a"]},
    ],
}


@pytest.mark.anyio
@pytest.mark.parametrize("strategy", ["plan-execute", "replan", "dag", "hierarchical"])
async def test_an_error_the_run_lets_through_leaves_it_as_itself_in_every_strategy(
    strategy: str,
) -> None:
    """A scripted model used up raises UnexpectedModelCall, not a task group's ExceptionGroup
    that ``except UnexpectedModelCall`` would miss (the step runs in a task group in some
    strategies and not in others)."""
    from hierplan.errors import UnexpectedModelCall

    events: list[RunEvent] = []
    model = ScriptedModel([plan_response(_TWO_STEPS)])  # no answer for any step
    with pytest.raises(UnexpectedModelCall):
        await hierplan.run("g", model=model, strategy=strategy, listeners=[events.append])
    last = events[-1]
    assert isinstance(last, RunFinished) and last.status == "error"
    assert last.error is not None and last.error.startswith("UnexpectedModelCall: ")


@pytest.mark.anyio
async def test_the_error_a_run_raises_for_a_group_is_the_one_to_act_on_with_the_rest_noted() -> (
    None
):
    import anyio

    from hierplan.errors import ModelAuthError
    from hierplan.runner.execute import _escaping

    cancelled = anyio.get_cancelled_exc_class()
    refused = ModelAuthError("HTTP 401")
    bug = ValueError("a bug")
    nested = BaseExceptionGroup("outer", [cancelled(), ExceptionGroup("inner", [bug, refused])])
    assert _escaping(nested) is refused  # the user must act on it, wherever it came from
    assert refused.__notes__ == ["other errors of the run at the same time: ValueError: a bug"]
    interrupt = KeyboardInterrupt()
    assert _escaping(BaseExceptionGroup("g", [ValueError("x"), interrupt])) is interrupt
    first = RuntimeError("first")
    assert _escaping(BaseExceptionGroup("g", [cancelled(), first])) is first
    only = cancelled()
    assert _escaping(BaseExceptionGroup("g", [only])) is only  # nothing but cancellations


@pytest.mark.anyio
async def test_a_run_its_caller_cancels_ends_its_events_with_run_finished_cancelled() -> None:
    import anyio

    from hierplan import FunctionModel, ModelRequest, ModelResponse

    async def slow(request: ModelRequest) -> ModelResponse:
        if request.phase == "planning":
            return plan_response(_TWO_STEPS)
        await anyio.sleep(30)
        return ModelResponse(text="late")

    events: list[RunEvent] = []
    with anyio.move_on_after(0.3) as scope:
        await hierplan.run(
            "g", model=FunctionModel(slow), strategy="dag", listeners=[events.append]
        )
    assert scope.cancelled_caught
    last = events[-1]
    assert isinstance(last, RunFinished) and last.status == "cancelled"
    assert last.error == "cancelled by the caller"
    assert [e.type for e in events].count("run_finished") == 1


def test_a_listener_that_raises_is_logged_and_the_others_still_get_every_event(
    caplog: pytest.LogCaptureFixture,
) -> None:
    bus = EventBus("r")
    seen: list[str] = []

    def broken_display(event: RunEvent) -> None:
        raise ValueError(f"cannot draw {event.path}")

    bus.subscribe(broken_display)
    bus.subscribe(lambda e: seen.append(e.path))
    with caplog.at_level(logging.ERROR, logger="hierplan"):
        for path in ("1", "1.1"):
            bus.emit(NodeStarted(path=path, kind="planner", goal="g"))
    assert seen == ["1", "1.1"]
    records = [r for r in caplog.records if r.name == "hierplan"]
    assert len(records) == 2
    assert "broken_display raised on a node_started event" in records[0].getMessage()
    assert records[0].exc_info is not None and "cannot draw 1" in str(records[0].exc_info[1])


def test_a_listener_raising_keyboard_interrupt_still_stops_the_emit() -> None:
    bus = EventBus("r")
    seen: list[str] = []

    def interrupted(event: RunEvent) -> None:
        raise KeyboardInterrupt

    bus.subscribe(interrupted)
    bus.subscribe(lambda e: seen.append(e.path))
    with pytest.raises(KeyboardInterrupt):
        bus.emit(NodeStarted(path="1", kind="planner", goal="g"))
    assert seen == []


@pytest.mark.anyio
async def test_a_run_goes_on_and_succeeds_past_a_listener_that_raises_on_every_event(
    caplog: pytest.LogCaptureFixture,
) -> None:
    def broken(event: RunEvent) -> None:
        raise RuntimeError("display bug")

    events: list[RunEvent] = []
    with caplog.at_level(logging.ERROR, logger="hierplan"):
        result = await hierplan.run(
            goal_for(GROUPS),
            tools=local_tools(),
            listeners=[broken, events.append],
            model=hierplan.Simulator(latency_scale=0, profile="ideal", oracle=CapitalsOracle()),
        )
    assert result.status == "succeeded", result.error
    check_events(events, result)
    logged = [r for r in caplog.records if r.name == "hierplan" and r.exc_text]
    assert len(logged) == len(events) and all("display bug" in (r.exc_text or "") for r in logged)


def test_every_type_the_emitters_ask_about_is_an_event_type() -> None:
    """``bus.wants("...")`` takes a type name as text: a misspelt one would build its event
    for listeners that did not ask for it."""
    package = Path(hierplan.__file__).parent
    asked = {
        name
        for source in package.rglob("*.py")
        for name in re.findall(r"\bwants\(\"(\w+)\"\)", source.read_text())
    }
    assert len(asked) >= 12, asked  # the emitters are found
    assert asked <= EVENT_TYPES, asked - EVENT_TYPES
