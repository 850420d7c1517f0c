"""Streamed model calls: the simulator's and the scripted model's streams, the fallback for
models that do not stream, retries before the first delta, and budgets settled at what a
closed stream wrote."""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from contextlib import aclosing, asynccontextmanager
from typing import Any

import anyio
import pytest

from hierplan.agents.costs import planning_request
from hierplan.agents.planner import PLAN_OUTPUT
from hierplan.agents.prompts import PlanPrompt, StepPrompt
from hierplan.budgets.budget import Budget
from hierplan.budgets.instrument import BudgetInstrument
from hierplan.core.events import BudgetSettled, RunEvent
from hierplan.core.settings import RunSettings
from hierplan.errors import ModelError
from hierplan.hierarchy.context import NodeContext, RunContext
from hierplan.models.base import (
    Message,
    Model,
    ModelRequest,
    ModelResponse,
    StreamItem,
    ToolCall,
    ToolSpec,
    stream_of,
)
from hierplan.models.scripted import FunctionModel, ScriptedModel, StreamedText
from hierplan.models.tokens import estimate_request_tokens, estimate_text_tokens
from hierplan.plans.plan import Plan, Step
from hierplan.pricing import Price, PriceTable
from hierplan.records import NodeRecord
from hierplan.simulator.model import SimulatedModel
from hierplan.simulator.oracle import Action
from hierplan.simulator.profiles import NoiseProfile
from hierplan.tools.base import Toolbox

pytestmark = pytest.mark.anyio

LOOKUP = ToolSpec(
    "lookup", "look a key up", {"type": "object", "properties": {"key": {"type": "integer"}}}
)


class FanOutOracle:
    """Plans one lookup per key, all independent; executors answer at once."""

    def __init__(self, keys: int = 6) -> None:
        self.keys = keys

    def plan(self, prompt: PlanPrompt) -> Plan | None:
        steps = [
            Step(
                id=f"s{i}",
                title=f"s{i}",
                instruction=f"look up {i}",
                tool="lookup",
                args={"key": i},
            )
            for i in range(1, self.keys + 1)
        ]
        return Plan(goal=prompt.goal, steps=steps)

    def act(self, prompt: StepPrompt, done: Sequence[tuple[ToolCall, str]]) -> Action | None:
        return Action(text="done")


def plan_request(path: str = "1") -> ModelRequest:
    prompt = PlanPrompt(goal="look everything up", depth=1, max_depth=1, max_steps=20)
    request = planning_request(prompt, (LOOKUP,), PLAN_OUTPUT, 4096, path=path)
    return request


async def collect(items: AsyncIterator[StreamItem]) -> tuple[list[str], ModelResponse]:
    deltas: list[str] = []
    async with aclosing(items) as stream:  # type: ignore[type-var]
        async for item in stream:
            if isinstance(item, ModelResponse):
                return deltas, item
            deltas.append(item)
    raise AssertionError("the stream ended with no response")


@pytest.mark.parametrize("profile", ["ideal", "typical", "weak"])
async def test_the_simulators_stream_writes_the_answer_request_gives(profile: str) -> None:
    """Same seed, same request: the streamed text joins to the answer ``request`` gives, with
    the same usage and flags (the draws are the same)."""
    whole = await SimulatedModel(FanOutOracle(), profile=profile, seed=3, latency_scale=0).request(
        plan_request()
    )
    streamed = SimulatedModel(FanOutOracle(), profile=profile, seed=3, latency_scale=0)
    deltas, response = await collect(streamed.stream(plan_request()))
    assert "".join(deltas) == whole.text == response.text
    assert len(deltas) > 1
    assert (response.usage, response.flags, response.simulated) == (whole.usage, whole.flags, True)


async def test_the_simulators_stream_paces_its_text_after_the_first_token() -> None:
    """The first delta comes after the fixed latency (and hidden reasoning), the rest at the
    profile's time per token: the stream lasts as long as ``request`` would."""
    profile = NoiseProfile(latency_median_s=0.05, latency_per_output_token_s=0.002)
    model = SimulatedModel(FanOutOracle(), profile=profile, seed=1)
    started = anyio.current_time()
    times: list[float] = []
    response: ModelResponse | None = None
    async with aclosing(model.stream(plan_request())) as stream:
        async for item in stream:
            if isinstance(item, ModelResponse):
                response = item
            else:
                times.append(anyio.current_time() - started)
    assert response is not None and response.usage is not None
    per_token = 0.002 * (response.usage.output_tokens - response.usage.reasoning_tokens)
    assert times[0] >= 0.05
    assert times[-1] - times[0] >= per_token * 0.5
    assert times[-1] >= 0.05 + per_token * 0.9


async def test_a_model_that_does_not_stream_gives_its_whole_answer_as_one_delta() -> None:
    model = FunctionModel(lambda request: ModelResponse(text="a\nb"))
    assert not hasattr(model, "stream")
    deltas, response = await collect(stream_of(model, plan_request()))
    assert (deltas, response.text) == (["a\nb"], "a\nb")


async def test_a_scripted_stream_pauses_where_its_script_says() -> None:
    go = anyio.Event()
    model = ScriptedModel([StreamedText(("1. lookup(1)\n", go, "2. lookup(2)\n"))])
    seen: list[str] = []
    async with aclosing(model.stream(plan_request())) as stream:
        async for item in stream:
            if isinstance(item, str):
                seen.append(item)
                go.set()  # only the reader's first delta lets the model go on
            else:
                assert item.text == "1. lookup(1)\n2. lookup(2)\n"
    assert seen == ["1. lookup(1)\n", "2. lookup(2)\n"]
    model.assert_complete()


# -- through a node: retries and budgets ------------------------------------------------------

PRICING = PriceTable({"test:model": Price(1.0, 4.0)})


@asynccontextmanager
async def budgeted_node(
    model: Model, budget: Budget, events: list[RunEvent]
) -> AsyncIterator[tuple[NodeContext, BudgetInstrument]]:
    instrument = BudgetInstrument(budget)
    ctx = RunContext(
        run_id="t",
        settings=RunSettings(model_retries=2, retry_backoff_s=0),
        toolbox=Toolbox(),
        planner_model=model,
        executor_model=model,
        pricing=PRICING,
        instruments=[instrument],
    )
    ctx.bus.subscribe(events.append)
    assert instrument.run_scope(ctx) is None
    node = NodeContext(ctx, NodeRecord("1", "planner", "g", 1), allowed_tools=frozenset())
    scope = instrument.node_scope(node)
    assert scope is not None
    async with scope:
        yield node, instrument


REQUEST = ModelRequest(messages=(Message("user", "x" * 400),), max_tokens=500, phase="planning")


def scripted(*items: Any) -> ScriptedModel:
    model = ScriptedModel(list(items))
    model.priced_as = "test:model"
    return model


async def test_a_stream_closed_early_settles_at_what_it_wrote() -> None:
    """The reader stops after the first line: the budget and the record count the input and
    the output of the text written, not the reservation's worst case; nothing stays held."""
    first = "1. lookup(1)\n"
    model = scripted(StreamedText((first, anyio.Event(), "2. lookup(2)\n")))
    events: list[RunEvent] = []
    async with budgeted_node(model, Budget(tokens=10_000), events) as (node, instrument):
        async with aclosing(node.stream_model(REQUEST)) as stream:
            async for item in stream:
                assert item == first
                break  # the model would wait for ever: only closing ends it
        held = await instrument.ledger.outstanding()
        assert (held.reservations, held.tokens) == (0, 0)
    spent = estimate_request_tokens(REQUEST) + estimate_text_tokens(first)
    settled = [e for e in events if isinstance(e, BudgetSettled)]
    assert [(e.tokens, e.flags) for e in settled] == [(spent, ["cut_short"])]
    (call,) = node.record.calls
    assert (call.ok, call.flags, call.usage.total_tokens) == (
        False,
        ["cut_short", "stream_closed"],
        spent,
    )
    assert node.record.budget is not None and node.record.budget["spent_tokens"] == spent


async def test_a_stream_cancelled_mid_way_settles_at_what_it_wrote() -> None:
    model = scripted(StreamedText(("1. lookup(1)\n", anyio.Event())))
    events: list[RunEvent] = []
    got_first = anyio.Event()

    async def read(node: NodeContext) -> None:
        async with aclosing(node.stream_model(REQUEST)) as stream:
            async for _ in stream:
                got_first.set()

    async with budgeted_node(model, Budget(tokens=10_000), events) as (node, instrument):
        async with anyio.create_task_group() as tg:
            tg.start_soon(read, node)
            await got_first.wait()
            tg.cancel_scope.cancel()
        held = await instrument.ledger.outstanding()
        assert (held.reservations, held.tokens) == (0, 0)
    spent = estimate_request_tokens(REQUEST) + estimate_text_tokens("1. lookup(1)\n")
    settled = [e for e in events if isinstance(e, BudgetSettled)]
    assert [e.tokens for e in settled] == [spent]


async def test_a_complete_stream_settles_at_the_reported_usage() -> None:
    model = scripted(StreamedText(("1. lookup(1)\n",)))
    events: list[RunEvent] = []
    async with budgeted_node(model, Budget(tokens=10_000), events) as (node, _):
        deltas, response = await collect(node.stream_model(REQUEST))
    assert deltas == ["1. lookup(1)\n"]
    assert response.usage is not None
    settled = [e for e in events if isinstance(e, BudgetSettled)]
    assert [(e.tokens, e.flags) for e in settled] == [(response.usage.total_tokens, [])]
    assert [c.ok for c in node.record.calls] == [True]


async def test_an_error_before_the_first_delta_is_retried_one_after_it_is_not() -> None:
    flaky = scripted(ModelError("busy", retryable=True), StreamedText(("ok\n",)))
    async with budgeted_node(flaky, Budget(tokens=10_000), []) as (node, _):
        deltas, _response = await collect(node.stream_model(REQUEST))
    assert deltas == ["ok\n"]
    assert [c.attempt for c in node.record.calls] == [1, 2]

    async def broken(request: ModelRequest) -> AsyncIterator[StreamItem]:
        yield "1. lookup(1)\n"
        raise ModelError("connection dropped", retryable=True)

    model = FunctionModel(lambda request: ModelResponse(text="unused"))
    model.stream = broken  # type: ignore[attr-defined]
    async with budgeted_node(model, Budget(tokens=10_000), []) as (node, _):
        with pytest.raises(ModelError, match="connection dropped"):
            await collect(node.stream_model(REQUEST))
    assert len(node.record.calls) == 1
