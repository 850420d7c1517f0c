"""A live view of the money: what each node was given (``node_started``), where an account
stands after each settlement, a handle's snapshot of every account, and a run its parent budget
cannot fund (skipped, or waiting for it)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import anyio.lowlevel
import pytest
from eventcheck import check_events
from typer.testing import CliRunner

import hierplan
from hierplan.agents.prompts import parse_step_prompt
from hierplan.budgets.budget import Account, Balance, Budget, Fixed, Grant, Reservation
from hierplan.budgets.instrument import BudgetInstrument
from hierplan.budgets.ledger import Ledger, LocalAccount, LocalLedger, Outstanding
from hierplan.cli import app
from hierplan.core.events import (
    BudgetReserved,
    BudgetSettled,
    NodeFinished,
    NodeStarted,
    RunEvent,
    RunFinished,
    RunStarted,
)
from hierplan.core.settings import RunSettings
from hierplan.errors import UserInputError
from hierplan.hierarchy.context import NodeContext, RunContext
from hierplan.models.base import Message, ModelRequest, ModelResponse, Phase
from hierplan.models.scripted import FunctionModel
from hierplan.pricing import Price, PriceTable
from hierplan.records import NodeRecord, RunResult
from hierplan.tools.base import Toolbox
from hierplan.units import Usage, usd_to_pico

pytestmark = pytest.mark.anyio

PRICING = PriceTable({"test:model": Price(1.0, 4.0)})
CALL_TOKENS = 150  # every call of these tests' models: 100 in, 50 out
CALL_USD = (100 * 1.0 + 50 * 4.0) / 1e6


def _model(hold: dict[str, anyio.Event] | None = None, *, priced: bool = True) -> FunctionModel:
    """Plans two steps (``Step 0``, ``Step 1``); every call uses 100 in and 50 out. A step whose
    instruction is a key of ``hold`` waits for its event before its call answers."""

    async def respond(request: ModelRequest) -> ModelResponse:
        if request.phase == "planning":
            steps = [{"id": f"s{i}", "title": "s", "instruction": f"Step {i}"} for i in range(2)]
            data = {"goal": "Root", "steps": steps}
            return ModelResponse(text=json.dumps(data), output=data, usage=Usage(100, 50))
        prompt = parse_step_prompt(request.messages)
        waits = (hold or {}).get(prompt.instruction if prompt is not None else "")
        if waits is not None:
            await waits.wait()
        return ModelResponse(text="done", usage=Usage(100, 50))

    model = FunctionModel(respond)
    model.priced_as = "test:model" if priced else "test:unpriced"
    return model


def _spec(model: FunctionModel) -> hierplan.RunSpec:
    return hierplan.RunSpec(goal="Root", model=model, pricing=PRICING)


class _RemoteAccount(Account):
    """An account of :class:`RemoteLedger`: not a local account, as a server's are not."""

    __slots__ = ("inner",)

    def __init__(self, inner: LocalAccount, parent: Account | None) -> None:
        super().__init__(inner.name, parent)
        self.inner = inner


class RemoteLedger(Ledger):
    """A local ledger behind accounts of its own, each answer after an await: what a ledger
    shared between processes looks like to a run (it cannot wake a waiting run)."""

    def __init__(self) -> None:
        self.inner = LocalLedger()

    @staticmethod
    def _local(account: Account) -> Account:
        return account.inner if isinstance(account, _RemoteAccount) else account

    async def open(self, name: str, parent: Account | None, grant: Grant) -> Account:
        await anyio.lowlevel.checkpoint()
        up = None if parent is None else self._local(parent)
        return _RemoteAccount(self.inner.open_now(name, up, grant), parent)

    async def reserve(
        self, account: Account, tokens: int, pico: int, phase: Phase
    ) -> Reservation | None:
        await anyio.lowlevel.checkpoint()
        return self.inner.reserve_now(self._local(account), tokens, pico, phase)

    async def settle(self, reservation: Reservation, tokens: int, pico: int) -> None:
        self.inner.settle_now(reservation, tokens, pico)

    async def release(self, reservation: Reservation) -> None:
        self.inner.settle_now(reservation, 0, 0, used=False)

    async def top_up(self, account: Account, tokens: int, pico: int) -> bool:
        await anyio.lowlevel.checkpoint()
        return self.inner.top_up_now(self._local(account), tokens, pico)

    async def close(self, account: Account) -> Balance:
        return self.inner.close_now(self._local(account))

    async def available(self, account: Account) -> tuple[int | None, int | None]:
        await anyio.lowlevel.checkpoint()
        return self.inner.available_now(self._local(account))

    async def balance(self, account: Account) -> Balance:
        await anyio.lowlevel.checkpoint()
        return self.inner.balance_now(self._local(account))

    async def outstanding(self) -> Outstanding:
        return await self.inner.outstanding()


def _started(events: list[RunEvent]) -> dict[str, NodeStarted]:
    return {e.path: e for e in events if isinstance(e, NodeStarted)}


# -- 1. node_started carries what the node was given ---------------------------------------


@pytest.mark.parametrize("allocation", ["equal", "weighted", "on-demand"])
async def test_node_started_carries_the_allocation_each_node_was_given(allocation: str) -> None:
    events: list[RunEvent] = []
    result = await hierplan.run(
        _spec(_model()),
        strategy="dag",
        budget={"tokens": 100_000, "usd": 1.0, "allocation": allocation},
        listeners=[events.append],
    )
    assert result.status == "succeeded", result.error
    check_events(events, result)
    started = _started(events)
    assert (started["1"].limit_tokens, started["1"].limit_usd) == (100_000, 1.0)
    for node in result.nodes():
        assert node.budget is not None
        event = started[node.path]
        assert event.limit_tokens == node.budget["limit_tokens"], node.path
        assert event.limit_usd == pytest.approx(node.budget["limit_usd"]), node.path
    leaves = [started[n.path] for n in result.nodes() if n.kind == "executor"]
    assert len(leaves) == 2 and all(0 < (e.limit_tokens or 0) < 100_000 for e in leaves)
    # Every node's start came before any other event of the node (its budget's among them).
    nodes = [e for e in events if not isinstance(e, RunStarted | RunFinished)]
    for path, event in started.items():
        assert next(e for e in nodes if e.path == path) is event


@pytest.mark.parametrize(
    ("budget", "tokens", "usd"),
    [({"usd": 0.5}, None, 0.5), ({"tokens": 9_000}, 9_000, None), (None, None, None)],
)
async def test_node_started_leaves_out_what_is_not_limited(
    budget: dict[str, Any] | None, tokens: int | None, usd: float | None
) -> None:
    events: list[RunEvent] = []
    result = await hierplan.run(
        _spec(_model()), strategy="dag", budget=budget, listeners=[events.append]
    )
    assert result.status == "succeeded", result.error
    root = _started(events)["1"]
    assert (root.limit_tokens, root.limit_usd) == (tokens, usd)
    for event in _started(events).values():
        assert (event.limit_tokens is None) == (tokens is None)
        assert (event.limit_usd is None) == (usd is None)


async def test_on_a_shared_ledger_node_started_says_what_each_node_was_given() -> None:
    events: list[RunEvent] = []
    instrument = BudgetInstrument(Budget(tokens=100_000, usd=1.0), ledger=RemoteLedger())
    result = await hierplan.run(
        _spec(_model()), strategy="dag", instruments=[instrument], listeners=[events.append]
    )
    assert result.status == "succeeded", result.error
    check_events(events, result)
    started = _started(events)
    for node in result.nodes():
        assert node.budget is not None
        assert started[node.path].limit_tokens == node.budget["limit_tokens"]
        assert started[node.path].limit_usd == pytest.approx(node.budget["limit_usd"])


# -- 2. a settlement says where its account stands ------------------------------------------


@asynccontextmanager
async def _budgeted_leaf(
    model: FunctionModel, budget: Budget, listener: Callable[[RunEvent], None], **options: Any
) -> AsyncIterator[NodeContext]:
    """One executor node with its own account under ``budget``, its events to ``listener``."""
    instrument = BudgetInstrument(budget, **options)
    ctx = RunContext(
        run_id="t",
        settings=RunSettings(model_retries=0),
        toolbox=Toolbox(),
        planner_model=model,
        executor_model=model,
        pricing=PRICING,
        instruments=[instrument],
    )
    ctx.bus.subscribe(listener)
    assert instrument.run_scope(ctx) is None
    node = NodeContext(ctx, NodeRecord("1", "executor", "g", 1), allowed_tools=frozenset())
    scope = instrument.node_scope(node)
    assert scope is not None
    async with scope:
        yield node


def _request(text: str) -> ModelRequest:
    return ModelRequest(messages=(Message("user", text),), max_tokens=100, phase="execution")


@pytest.mark.parametrize("ledger", [LocalLedger, RemoteLedger])
async def test_each_settlement_says_what_its_account_spent_holds_and_has_left(
    ledger: Callable[[], Ledger],
) -> None:
    release, holding = anyio.Event(), anyio.Event()
    events: list[RunEvent] = []

    def listen(event: RunEvent) -> None:
        events.append(event)
        if isinstance(event, BudgetReserved):
            holding.set()

    async def respond(request: ModelRequest) -> ModelResponse:
        if request.messages[0].content == "slow":
            await release.wait()
        return ModelResponse(text="ok", usage=Usage(100, 50))

    model = FunctionModel(respond)
    model.priced_as = "test:model"
    limit = Budget(tokens=100_000, usd=1.0)
    async with (
        _budgeted_leaf(model, limit, listen, ledger=ledger()) as node,
        anyio.create_task_group() as tg,
    ):
        tg.start_soon(node.call_model, _request("slow"))
        await holding.wait()  # the slow call holds its reservation until released
        await node.call_model(_request("fast"))
        release.set()
    slow = next(e for e in events if isinstance(e, BudgetReserved))
    fast, last = [e for e in events if isinstance(e, BudgetSettled)]
    assert (fast.spent_tokens, fast.held_tokens) == (CALL_TOKENS, slow.tokens)
    assert fast.remaining_tokens == 100_000 - CALL_TOKENS - slow.tokens
    assert fast.spent_usd == pytest.approx(CALL_USD)
    assert fast.held_usd == slow.usd
    assert fast.remaining_usd == pytest.approx(1.0 - CALL_USD - (slow.usd or 0.0))
    assert (last.spent_tokens, last.held_tokens) == (2 * CALL_TOKENS, 0)
    assert last.remaining_tokens == 100_000 - 2 * CALL_TOKENS
    assert last.held_usd == 0.0 and last.remaining_usd == pytest.approx(1.0 - 2 * CALL_USD)


async def test_a_settlement_without_usd_tracked_or_limited_says_none_for_usd() -> None:
    events: list[RunEvent] = []
    model = FunctionModel(lambda request: ModelResponse(text="ok", usage=Usage(100, 50)))
    model.priced_as = "test:unpriced"
    async with _budgeted_leaf(model, Budget(tokens=10_000), events.append) as node:
        await node.call_model(_request("x"))
    (settled,) = [e for e in events if isinstance(e, BudgetSettled)]
    assert (settled.spent_tokens, settled.held_tokens) == (CALL_TOKENS, 0)
    assert settled.remaining_tokens == 10_000 - CALL_TOKENS
    assert (settled.spent_usd, settled.held_usd, settled.remaining_usd) == (None, None, None)
    # A priced model under a tokens-only budget: spent in USD, nothing left to say in USD.
    events.clear()
    model.priced_as = "test:model"
    async with _budgeted_leaf(model, Budget(tokens=10_000), events.append) as node:
        await node.call_model(_request("x"))
    (settled,) = [e for e in events if isinstance(e, BudgetSettled)]
    assert settled.spent_usd == pytest.approx(CALL_USD) and settled.remaining_usd is None


# -- 3. a handle's snapshot of every account ------------------------------------------------


async def _until_one_step_done_and_the_other_holding(
    handle: hierplan.RunHandle,
) -> tuple[dict[str, str], BudgetReserved]:
    """Read the run's events until step s1 has finished and step s0's call is reserved (in
    whichever order they come); the steps' paths and s0's reservation."""
    paths: dict[str, str] = {}
    finished = False
    reserved: BudgetReserved | None = None
    async for event in handle.events():
        if isinstance(event, NodeStarted) and event.step_id is not None:
            paths[event.step_id] = event.path
        elif isinstance(event, NodeFinished) and event.path == paths.get("s1"):
            finished = True
        elif isinstance(event, BudgetReserved) and event.path == paths.get("s0"):
            reserved = event
        if finished and reserved is not None:
            return paths, reserved
    raise AssertionError("the run ended first")


async def test_a_handle_snapshots_every_account_while_the_run_goes_and_after() -> None:
    release = anyio.Event()
    async with hierplan.start(
        _spec(_model({"Step 0": release})),
        strategy="dag",
        budget={"tokens": 100_000, "usd": 1.0},
    ) as handle:
        paths, reserved = await _until_one_step_done_and_the_other_holding(handle)
        live = await handle.budget_snapshot()
        release.set()
        result = await handle.result()
    after = await handle.budget_snapshot()
    held, done = paths["s0"], paths["s1"]
    assert list(live) == ["1", *sorted((held, done))]  # the tree's order
    root, holding, closed = live["1"], live[held], live[done]
    assert (root.grant, root.closed, root.limit_tokens, root.limit_usd) == (
        "root",
        False,
        100_000,
        1.0,
    )
    # The root's own planning call and its closed child's call; the open child is granted.
    assert (root.spent_tokens, root.held_tokens) == (2 * CALL_TOKENS, 0)
    assert holding.limit_tokens is not None and holding.limit_usd is not None
    assert root.remaining_tokens == 100_000 - 2 * CALL_TOKENS - holding.limit_tokens
    assert (holding.closed, holding.spent_tokens, holding.held_tokens) == (
        False,
        0,
        reserved.tokens,
    )
    assert holding.held_usd == reserved.usd
    assert holding.remaining_tokens == holding.limit_tokens - reserved.tokens
    assert holding.remaining_usd == pytest.approx(holding.limit_usd - (reserved.usd or 0.0))
    assert (closed.closed, closed.spent_tokens, closed.held_tokens) == (True, CALL_TOKENS, 0)
    assert closed.spent_usd == pytest.approx(CALL_USD) and closed.remaining_tokens == 0
    # After the run: every account closed, the root's spend the run's.
    assert result.status == "succeeded" and result.budget is not None
    assert list(after) == list(live) and all(a.closed for a in after.values())
    assert after["1"].spent_tokens == result.budget["spent"]["tokens"] == 3 * CALL_TOKENS
    assert after["1"].spent_usd == pytest.approx(result.budget["spent"]["usd"])
    assert after[held].limit_tokens == holding.limit_tokens


async def test_a_snapshot_on_a_shared_ledger_and_without_a_budget() -> None:
    instrument = BudgetInstrument(Budget(tokens=100_000), ledger=RemoteLedger())
    release = anyio.Event()
    async with hierplan.start(
        _spec(_model({"Step 0": release})), strategy="dag", instruments=[instrument]
    ) as handle:
        paths, reserved = await _until_one_step_done_and_the_other_holding(handle)
        live = await handle.budget_snapshot()
        release.set()
        result = await handle.result()
    assert live[paths["s0"]].held_tokens == reserved.tokens and not live["1"].closed
    assert live[paths["s1"]].closed and live[paths["s1"]].spent_tokens == CALL_TOKENS
    assert live["1"].limit_usd is None and live["1"].remaining_usd is None
    after = await handle.budget_snapshot()
    assert result.budget is not None
    assert after["1"].spent_tokens == result.budget["spent"]["tokens"]
    async with hierplan.start(_spec(_model()), strategy="dag") as unbudgeted:
        await unbudgeted.result()
    assert await unbudgeted.budget_snapshot() == {}


# -- 5. a run its parent budget cannot fund -------------------------------------------------


def _platform(usd: float) -> tuple[LocalLedger, Account]:
    """A ledger with one account that funds runs, as a platform's shared budget does."""
    ledger = LocalLedger()
    return ledger, ledger.open_now("platform", None, Fixed(None, usd_to_pico(usd)))


async def test_a_run_its_parent_budget_cannot_fund_is_skipped_without_raising(
    tmp_path: Path,
) -> None:
    ledger, platform = _platform(0.005)
    instrument = BudgetInstrument(Budget(usd=0.01), ledger=ledger, parent=platform)
    model = _model()
    events: list[RunEvent] = []
    result = await hierplan.run(
        _spec(model), strategy="dag", instruments=[instrument], listeners=[events.append]
    )
    assert (result.status, result.reason, result.answer_complete) == ("skipped", "budget", False)
    assert result.error is not None
    assert "'1' needs $0.010000 but 'platform' has only $0.005000 left" in result.error
    assert "tokens" not in result.error  # a USD-only budget's message names USD only
    assert result.tree.status == "skipped" and result.tree.error == result.error
    assert not result.tree.calls and model.calls == 0
    check_events(events, result)
    assert [e.type for e in events] == [
        "run_started",
        "node_started",
        "node_finished",
        "run_finished",
    ]
    finished = events[-1]
    assert isinstance(finished, RunFinished)
    assert (finished.status, finished.reason) == ("skipped", "budget")
    assert (await ledger.outstanding()).accounts == 1  # the platform's own
    # Its record is saved, read back, and shown like any other.
    path = result.write(tmp_path / "run.json")
    loaded = RunResult.load(path)
    assert (loaded.status, loaded.reason) == ("skipped", "budget")
    shown = CliRunner().invoke(app, ["view", str(path)])
    assert shown.exit_code == 0, shown.output
    assert "skipped" in shown.output


async def test_a_skipped_run_s_trace_says_skipped() -> None:
    from tracing_support import Telemetry

    ledger, platform = _platform(0.005)
    telemetry = Telemetry()
    instrument = BudgetInstrument(Budget(usd=0.01), ledger=ledger, parent=platform)
    result = await hierplan.run(
        _spec(_model()), strategy="dag", instruments=[telemetry.tracing(), instrument]
    )
    assert result.status == "skipped"
    spans = telemetry.finished()
    (workflow,) = [s for s in spans if s.parent is None]
    attributes = workflow.attributes or {}
    assert attributes["hierplan.run.status"] == attributes["hierplan.node.status"] == "skipped"
    for span in spans:
        if "hierplan.node.status" in (span.attributes or {}):
            assert (span.attributes or {})["hierplan.node.status"] == "skipped", span.name


async def test_a_tokens_only_run_that_cannot_be_funded_names_tokens_only() -> None:
    ledger = LocalLedger()
    pool = ledger.open_now("pool", None, Fixed(1_000, None))
    instrument = BudgetInstrument(Budget(tokens=5_000), ledger=ledger, parent=pool)
    result = await hierplan.run(_spec(_model()), strategy="dag", instruments=[instrument])
    assert result.status == "skipped" and result.error is not None
    assert "'1' needs 5,000 tokens but 'pool' has only 1,000 tokens left" in result.error
    assert "$" not in result.error


def test_a_record_written_before_runs_could_be_skipped_loads(tmp_path: Path) -> None:
    result = hierplan.RunResult(
        run_id="r",
        goal="g",
        strategy="dag",
        model="m",
        simulated=True,
        status="succeeded",
        answer="a",
        tree=NodeRecord("1", "planner", "g", 1, status="succeeded"),
    )
    data = result.to_dict()
    del data["reason"]
    path = tmp_path / "run.json"
    path.write_text(json.dumps(data), encoding="utf-8")
    assert RunResult.load(path).reason is None


def _listener(
    name: str, log: list[tuple[str, RunEvent]], signal: anyio.Event, when: str
) -> Callable[[RunEvent], None]:
    """Logs a run's events under ``name``; sets ``signal`` at its first event of type
    ``when`` (for ``node_started``: the root's)."""

    def listen(event: RunEvent) -> None:
        log.append((name, event))
        if event.type == when and event.path == "1":
            signal.set()

    return listen


@pytest.mark.parametrize("ledger_kind", ["local", "shared"])
async def test_a_waiting_run_starts_once_another_gives_the_budget_back(ledger_kind: str) -> None:
    # The platform can fund one run of $0.5 at a time (and a little more).
    ledger: Ledger = LocalLedger() if ledger_kind == "local" else RemoteLedger()
    platform = await ledger.open("platform", None, Fixed(None, usd_to_pico(0.8)))
    log: list[tuple[str, RunEvent]] = []
    release, a_started, b_started = anyio.Event(), anyio.Event(), anyio.Event()
    results: dict[str, RunResult] = {}

    async def run(name: str, model: FunctionModel, wait: bool, signal: anyio.Event) -> None:
        instrument = BudgetInstrument(
            Budget(usd=0.5), ledger=ledger, parent=platform, wait_for_budget=wait
        )
        when = "node_started" if name == "a" else "run_started"
        results[name] = await hierplan.run(
            _spec(model),
            strategy="dag",
            instruments=[instrument],
            listeners=[_listener(name, log, signal, when)],
        )

    async with anyio.create_task_group() as tg:
        tg.start_soon(run, "a", _model({"Step 0": release, "Step 1": release}), False, a_started)
        await a_started.wait()  # A holds $0.5 of the platform's $0.8
        tg.start_soon(run, "b", _model(), True, b_started)
        await b_started.wait()  # B has started and cannot have its budget yet
        release.set()
    assert results["a"].status == results["b"].status == "succeeded"
    b_root = next(
        i for i, (n, e) in enumerate(log) if n == "b" and e.type == "node_started" and e.path == "1"
    )
    a_settled = [i for i, (n, e) in enumerate(log) if n == "a" and e.type == "budget_settled"]
    assert a_settled and max(a_settled) < b_root  # B got its budget once A had given it back
    started = log[b_root][1]
    assert isinstance(started, NodeStarted) and started.limit_usd == 0.5
    assert (await ledger.outstanding()).accounts == 1


async def test_a_run_that_waits_past_its_timeout_is_skipped() -> None:
    ledger, platform = _platform(0.8)
    release, a_started = anyio.Event(), anyio.Event()
    log: list[tuple[str, RunEvent]] = []
    results: dict[str, RunResult] = {}

    async def run_a() -> None:
        instrument = BudgetInstrument(Budget(usd=0.5), ledger=ledger, parent=platform)
        results["a"] = await hierplan.run(
            _spec(_model({"Step 0": release, "Step 1": release})),
            strategy="dag",
            instruments=[instrument],
            listeners=[_listener("a", log, a_started, "node_started")],
        )

    async with anyio.create_task_group() as tg:
        tg.start_soon(run_a)
        await a_started.wait()
        waiting = BudgetInstrument(
            Budget(usd=0.5),
            ledger=ledger,
            parent=platform,
            wait_for_budget=True,
            wait_timeout_s=0.05,
        )
        skipped = await hierplan.run(_spec(_model()), strategy="dag", instruments=[waiting])
        release.set()
    assert (skipped.status, skipped.reason) == ("skipped", "budget")
    assert skipped.error is not None and "(waited 0.05 s)" in skipped.error
    assert results["a"].status == "succeeded"
    assert (await ledger.outstanding()).accounts == 1


async def test_a_run_waiting_for_its_budget_can_be_cancelled() -> None:
    ledger, platform = _platform(0.8)
    release, a_started = anyio.Event(), anyio.Event()
    log: list[tuple[str, RunEvent]] = []
    results: dict[str, RunResult] = {}

    async def run_a() -> None:
        instrument = BudgetInstrument(Budget(usd=0.5), ledger=ledger, parent=platform)
        results["a"] = await hierplan.run(
            _spec(_model({"Step 0": release, "Step 1": release})),
            strategy="dag",
            instruments=[instrument],
            listeners=[_listener("a", log, a_started, "node_started")],
        )

    async with anyio.create_task_group() as tg:
        tg.start_soon(run_a)
        await a_started.wait()
        waiting = BudgetInstrument(
            Budget(usd=0.5), ledger=ledger, parent=platform, wait_for_budget=True
        )
        async with hierplan.start(_spec(_model()), strategy="dag", instruments=[waiting]) as handle:
            async for event in handle.events():
                if event.type == "run_started":
                    break
            assert await handle.budget_snapshot() == {}  # no account yet: it waits
            assert handle.cancel()
            cancelled = await handle.result()
        release.set()
    assert cancelled.status == "cancelled" and cancelled.tree.status == "cancelled"
    assert results["a"].status == "succeeded"
    assert (await ledger.outstanding()).accounts == 1


def test_a_local_ledger_says_when_it_gives_something_back() -> None:
    async def main() -> None:
        ledger = LocalLedger()
        root = ledger.open_now("root", None, Fixed(1_000, None))
        child = ledger.open_now("child", root, Fixed(500, None))
        reservation = ledger.reserve_now(child, 100, 0, "execution")
        assert reservation is not None
        freed = ledger.freed()
        assert not freed.is_set() and ledger.freed() is freed
        ledger.settle_now(reservation, 40, 0)
        assert freed.is_set() and not ledger.freed().is_set()
        freed = ledger.freed()
        ledger.close_now(child)
        assert freed.is_set()

    anyio.run(main)


@pytest.mark.parametrize("timeout", [-1.0, float("nan"), "5", True])
def test_a_bad_wait_timeout_is_refused(timeout: Any) -> None:
    with pytest.raises(UserInputError, match="wait_timeout_s"):
        BudgetInstrument(Budget(usd=1.0), wait_for_budget=True, wait_timeout_s=timeout)
