"""Property tests: random trees, fan-out, concurrency, usage, failures and cancellations.

Whatever happens, at every account and at the root, spent never exceeds the budget; after the
run every account balances (allocated = spent + released) and nothing is outstanding.

Two levels: the ledger contract alone (random trees of accounts doing random calls under real
anyio concurrency, checked after every operation), and whole runs through ``hierplan.run`` with
random hierarchical plans and misbehaving models. ``make test`` runs a default number of
examples; the ``slow`` marker runs at least 10,000 of each (``.ci/run``).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import anyio
import anyio.lowlevel
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from ledger_factories import LEDGERS, RecordingBudget

import hierplan
from hierplan.agents.prompts import parse_plan_prompt, parse_step_prompt
from hierplan.budgets.budget import Account, Budget, Draw, Fixed, Grant, Share
from hierplan.budgets.ledger import Ledger
from hierplan.core.events import BudgetReserved, BudgetSettled, RunEvent
from hierplan.core.settings import RunSettings
from hierplan.errors import BudgetTooSmall, ModelError
from hierplan.models.base import ModelRequest, ModelResponse, ToolCall
from hierplan.models.scripted import FunctionModel
from hierplan.models.tokens import estimate_request_tokens
from hierplan.pricing import Price, PriceTable
from hierplan.records import RunResult
from hierplan.tools.base import tool
from hierplan.units import Usage, usd_to_pico

DEFAULT_EXAMPLES = 150
RUN_EXAMPLES = 40
SLOW_EXAMPLES = 10_000

# -- the ledger alone ----------------------------------------------------------------------


@dataclass
class CallSpec:
    tokens: int
    pico: int
    used: float  # fraction of the reservation the call uses
    outcome: str  # settle | fail_usage | fail_none
    checkpoints: int


@dataclass
class NodeSpec:
    grant: str  # share | draw
    fraction: float
    calls: list[CallSpec]
    children: list[NodeSpec]
    parallel: bool
    cancel_after: int | None  # checkpoints before the node's subtree is cancelled


calls = st.builds(
    CallSpec,
    tokens=st.integers(0, 400),
    pico=st.integers(0, 4_000),
    used=st.floats(0.0, 1.0),
    outcome=st.sampled_from(["settle", "settle", "fail_usage", "fail_none"]),
    checkpoints=st.integers(0, 3),
)


def _node(children: st.SearchStrategy[list[NodeSpec]]) -> st.SearchStrategy[NodeSpec]:
    return st.builds(
        NodeSpec,
        grant=st.sampled_from(["share", "draw"]),
        fraction=st.floats(0.0, 1.0),
        calls=st.lists(calls, max_size=4),
        children=children,
        parallel=st.booleans(),
        cancel_after=st.one_of(st.none(), st.integers(0, 6)),
    )


trees = st.recursive(
    _node(st.just([])),
    lambda inner: _node(st.lists(inner, max_size=5)),
    max_leaves=30,
)
token_limits = st.integers(0, 3_000)
pico_limits = st.integers(0, 30_000)
budgets = st.one_of(
    st.tuples(token_limits, st.none()),
    st.tuples(st.none(), pico_limits),
    st.tuples(token_limits, pico_limits),
)


class Checked:
    """Runs a tree against a ledger, checking the invariants after every operation."""

    def __init__(self, ledger: Ledger) -> None:
        self.ledger = ledger
        self.accounts: list[Account] = []
        self.own_tokens = 0
        self.own_pico = 0
        self.refused = False
        self.cancelled = False
        self.violations: list[str] = []

    async def check(self) -> None:
        """Note (not raise: that would tangle the task groups) any account over its limit."""
        for account in self.accounts:
            b = await self.ledger.balance(account)
            used_t = b.spent_tokens + b.reserved_tokens + b.granted_tokens
            used_p = b.spent_pico + b.reserved_pico + b.granted_pico
            if b.limit_tokens is not None and used_t > b.limit_tokens:
                self.violations.append(f"{b.name}: {used_t} tokens held over {b.limit_tokens}")
            if b.limit_pico is not None and used_p > b.limit_pico:
                self.violations.append(f"{b.name}: {used_p} pico held over {b.limit_pico}")
            if min(b.reserved_tokens, b.reserved_pico, b.granted_tokens, b.granted_pico) < 0:
                self.violations.append(f"{b.name}: negative holdings {b}")

    async def call(self, account: Account, spec: CallSpec) -> None:
        held = await self.ledger.reserve(account, spec.tokens, spec.pico, "execution")
        if held is None:
            self.refused = True
            await self.check()
            return
        try:
            # Checked inside the try: a ledger that awaits I/O can be cancelled right here.
            await self.check()
            for _ in range(spec.checkpoints):
                await anyio.lowlevel.checkpoint()
        except BaseException:
            self.cancelled = True
            await self.ledger.release(held)  # cancelled mid-call
            await self.check()
            raise
        if spec.outcome == "fail_none":
            await self.ledger.release(held)
        else:
            tokens = int(spec.tokens * spec.used)
            pico = int(spec.pico * spec.used)
            await self.ledger.settle(held, tokens, pico)
            self.own_tokens += tokens
            self.own_pico += pico
        await self.check()

    async def node(self, spec: NodeSpec, parent: Account, name: str) -> None:
        grant: Grant = (
            Share(spec.fraction, spec.fraction) if spec.grant == "share" else Draw(spec.fraction)
        )
        account = await self.ledger.open(name, parent, grant)
        self.accounts.append(account)
        try:
            await self.check()
            with anyio.CancelScope() as scope:
                async with anyio.create_task_group() as tg:
                    if spec.cancel_after is not None:
                        tg.start_soon(_cancel_later, scope, spec.cancel_after)
                    await self._work(tg, spec, account, name)
        finally:
            await self.ledger.close(account)
            await self.check()

    async def _work(
        self, tg: anyio.abc.TaskGroup, spec: NodeSpec, account: Account, name: str
    ) -> None:
        jobs: list[Callable[[], Any]] = [partial(self.call, account, c) for c in spec.calls]
        jobs += [
            (lambda c=c, i=i: self.node(c, account, f"{name}.{i}"))  # type: ignore[misc]
            for i, c in enumerate(spec.children, 1)
        ]
        for job in jobs:
            if spec.parallel:
                tg.start_soon(job)
            else:
                await job()


async def _cancel_later(scope: anyio.CancelScope, checkpoints: int) -> None:
    for _ in range(checkpoints):
        await anyio.lowlevel.checkpoint()
    scope.cancel()


def _check_tree(
    factory: Callable[[], Ledger], budget: tuple[int | None, int | None], tree: NodeSpec
) -> None:
    async def main() -> None:
        ledger = factory()
        checked = Checked(ledger)
        root = await ledger.open("1", None, Fixed(*budget))
        checked.accounts.append(root)
        await checked.node(tree, root, "1.1")
        final = await ledger.close(root)
        assert checked.violations == [], checked.violations[:3]
        out = await ledger.outstanding()
        assert (out.reservations, out.tokens, out.pico, out.accounts) == (0, 0, 0, 0)
        for account in checked.accounts:
            b = await ledger.balance(account)
            assert b.closed and b.balanced, b
            assert b.limit_tokens is None or b.spent_tokens <= b.limit_tokens
            assert b.limit_pico is None or b.spent_pico <= b.limit_pico
        event(f"accounts>5={len(checked.accounts) > 5}")
        event(f"a reservation was refused={checked.refused}")
        event(f"a subtree was cancelled={checked.cancelled}")
        assert budget[0] is None or final.spent_tokens <= budget[0]
        assert budget[1] is None or final.spent_pico <= budget[1]
        # Nothing spent anywhere escapes the root's count.
        assert (final.spent_tokens, final.spent_pico) == (checked.own_tokens, checked.own_pico)

    anyio.run(main)


def _ledger_property(examples: int) -> Callable[[], None]:
    @settings(
        max_examples=examples,
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )
    @given(ledger=st.sampled_from(sorted(LEDGERS)), budget=budgets, tree=trees)
    def prop(ledger: str, budget: tuple[int | None, int | None], tree: NodeSpec) -> None:
        _check_tree(LEDGERS[ledger], budget, tree)

    return prop


test_ledger_never_overspends = _ledger_property(DEFAULT_EXAMPLES)
test_ledger_never_overspends_long = pytest.mark.slow(_ledger_property(SLOW_EXAMPLES))


# -- whole runs ----------------------------------------------------------------------------


@dataclass
class World:
    """A random goal tree, and how each executor call behaves, keyed by goal text."""

    plans: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    behaviour: dict[str, list[tuple[str, float]]] = field(default_factory=dict)
    seen: dict[str, int] = field(default_factory=dict)


@st.composite
def worlds(draw: st.DrawFn) -> World:
    world = World()

    def plan(goal: str, depth: int) -> None:
        width = draw(st.integers(1, 4))
        steps: list[dict[str, Any]] = []
        for i in range(1, width + 1):
            sub = depth < 3 and draw(st.booleans())
            text = f"{'Plan' if sub else 'Do'} part {goal.split()[-1]}.{i}"
            deps = (
                sorted(draw(st.sets(st.sampled_from([s["id"] for s in steps]), max_size=2)))
                if steps
                else []
            )
            step: dict[str, Any] = {
                "id": f"s{i}",
                "title": text,
                "instruction": text,
                "depends_on": deps,
            }
            if sub:
                step["kind"] = "subgoal"
                step["estimate_tokens"] = draw(st.integers(0, 5_000))
                plan(text, depth + 1)
            else:
                world.behaviour[text] = draw(
                    st.lists(
                        st.tuples(
                            st.sampled_from(["answer", "tool", "fail_usage", "fail_none", "slow"]),
                            st.floats(0.0, 1.0),
                        ),
                        min_size=1,
                        max_size=4,
                    )
                )
            steps.append(step)
        world.plans[goal] = steps

    plan("Plan part 1", 1)
    return world


def _models(world: World) -> tuple[FunctionModel, FunctionModel]:
    async def planner(request: ModelRequest) -> ModelResponse:
        prompt = parse_plan_prompt(request.messages)
        assert prompt is not None
        await anyio.lowlevel.checkpoint()
        data = {"goal": prompt.goal, "steps": world.plans[prompt.goal]}
        return ModelResponse(text=json.dumps(data), output=data, usage=_usage(request, 0.5))

    async def executor(request: ModelRequest) -> ModelResponse:
        prompt = parse_step_prompt(request.messages)
        assert prompt is not None
        key = prompt.instruction
        turn = world.seen.get(key, 0)
        world.seen[key] = turn + 1
        script = world.behaviour[key]
        kind, used = script[min(turn, len(script) - 1)]
        await anyio.lowlevel.checkpoint()
        if kind == "slow":
            await anyio.sleep(1)  # past the step deadline: cancelled mid-call
        if kind == "fail_usage":
            raise ModelError("overloaded", retryable=True, usage=_usage(request, used))
        if kind == "fail_none":
            raise ModelError("connection reset", retryable=True)
        if kind == "tool" and not any(m.role == "tool" for m in request.messages):
            call = ToolCall("c1", "echo", {"text": key})
            return ModelResponse(tool_calls=(call,), usage=_usage(request, used))
        return ModelResponse(text=f"done: {key}", usage=_usage(request, used))

    return (
        FunctionModel(planner, name="planner", priced_as="test:model"),
        FunctionModel(executor, name="executor", priced_as="test:model"),
    )


def _usage(request: ModelRequest, used: float) -> Usage:
    """Usage at or below what the budget reserved for the request."""
    return Usage(estimate_request_tokens(request), int(request.max_tokens * used))


@tool
def echo(text: str) -> str:
    """Say the text back."""
    return text


def _check_run(
    world: World, allocation: str, tokens: int | None, usd: float | None, concurrency: int
) -> None:
    planner, executor = _models(world)
    pricing = PriceTable({"test:model": Price(1.0, 4.0)})
    instrument = RecordingBudget(Budget(tokens, usd), allocation=allocation)
    settings_ = RunSettings(
        strategy="hierarchical",
        concurrency=concurrency,
        plan_concurrency=concurrency,
        max_retries=1,
        retry_backoff_s=0,
        model_retries=1,
        step_timeout_s=0.01,
        planner_max_tokens=600,
        executor_max_tokens=200,
        max_replans=1,
    )

    seen: list[RunEvent] = []

    async def main() -> RunResult:
        return await hierplan.run(
            hierplan.RunSpec(
                goal="Plan part 1",
                model=planner,
                executor_model=executor,
                settings=settings_,
                pricing=pricing,
            ),
            listeners=[seen.append],
            tools=[echo],
            instruments=[instrument],
        )

    try:
        result = anyio.run(main)
    except BudgetTooSmall as exc:
        # The budget cannot pay for the first call: refused before any call, at no cost.
        event("too small to start")
        assert "The smallest budget that starts this run is" in str(exc)
        assert not [e for e in seen if isinstance(e, BudgetReserved)]
        out = anyio.run(instrument.ledger.outstanding)
        assert (out.reservations, out.tokens, out.pico, out.accounts) == (0, 0, 0, 0)
        return
    event(f"status={result.status}")
    event(f"exhausted={bool(result.budget and result.budget['exhausted'])}")
    event(f"nodes>10={sum(1 for _ in result.nodes()) > 10}")
    settled = [e for e in seen if isinstance(e, BudgetSettled)]
    event(f"cut short mid-call={any(e.flags == ['cut_short'] for e in settled)}")
    event(f"failed with usage={any(e.flags == ['failed'] for e in settled)}")
    reserved = sum(1 for e in seen if isinstance(e, BudgetReserved))
    assert reserved == len(settled)  # every reservation was settled or released
    assert result.status in ("succeeded", "partial", "failed")
    assert result.answer_complete == (result.status == "succeeded")
    out = anyio.run(instrument.ledger.outstanding)
    assert (out.reservations, out.tokens, out.pico, out.accounts) == (0, 0, 0, 0)
    [run_budget] = instrument.runs
    root = run_budget.root_balance
    assert root is not None and root.balanced
    assert tokens is None or root.spent_tokens <= tokens
    assert usd is None or root.spent_pico <= usd_to_pico(usd)
    for node in result.nodes():
        if node.budget is None:
            assert not node.calls
            continue
        figures = node.budget
        assert figures["limit_tokens"] is None or figures["spent_tokens"] <= figures["limit_tokens"]
        assert figures["overrun_tokens"] == 0
        if node.budget["limit_usd"] is not None:
            assert node.budget["spent_usd"] <= node.budget["limit_usd"]
    # the calls in the record and the ledger agree to the token
    recorded = sum(c.usage.total_tokens for n in result.nodes() for c in n.calls)
    assert recorded == root.spent_tokens
    if result.status != "succeeded":
        assert result.not_done()


def _run_property(examples: int) -> Callable[[], None]:
    @settings(
        max_examples=examples,
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )
    @given(
        world=worlds(),
        allocation=st.sampled_from(["need", "equal", "weighted", "on-demand"]),
        tokens=st.one_of(st.none(), st.integers(0, 12_000)),
        usd=st.one_of(st.none(), st.floats(0.0, 0.03)),
        concurrency=st.integers(1, 8),
    )
    def prop(
        world: World, allocation: str, tokens: int | None, usd: float | None, concurrency: int
    ) -> None:
        if tokens is None and usd is None:
            tokens = 6_000
        _check_run(world, allocation, tokens, usd, concurrency)

    return prop


test_runs_never_overspend = _run_property(RUN_EXAMPLES)
test_runs_never_overspend_long = pytest.mark.slow(_run_property(SLOW_EXAMPLES))
