"""Budgets as an :class:`~hierplan.core.instrument.Instrument`: a ledger account per node and a
call scope that reserves before every model call and settles after.

:class:`BudgetInstrument` opens each node's account when the node starts (carved from its parent
by the allocation policy, in proportion to the weights of the plan's steps) and closes it when
the node ends, writing the node's ``record.budget``; at the end of the run it sums the budgets
up per level and phase. :class:`~hierplan.budgets.calls.BudgetCallScope` reserves each call's
worst case (lowering ``max_tokens`` to fit, or refusing it) and settles what the call's outcome
counts.

It reads the run through the core's views only: providers, plans and strategies know nothing of
it, and it knows nothing of them.
"""

from __future__ import annotations

import math
from contextlib import AbstractAsyncContextManager
from types import MappingProxyType, TracebackType
from typing import Any

import anyio

from hierplan.budgets.budget import (
    ALLOCATIONS,
    DEFAULT_ALLOCATION,
    DEFAULT_ON_DEMAND_FRACTION,
    Account,
    Balance,
    Budget,
    Draw,
    Fixed,
    Grant,
    Share,
    step_weights,
)
from hierplan.budgets.calls import BUDGET_OPTIONS, BudgetCallScope, CallCounts, amount_text
from hierplan.budgets.ledger import Ledger, LocalAccount, LocalLedger
from hierplan.budgets.resumed import (
    _continued,
)
from hierplan.budgets.snapshot import AccountSnapshot, snapshot_of
from hierplan.budgets.waiting import SHARED_LEDGER_POLL_S as SHARED_LEDGER_POLL_S
from hierplan.budgets.waiting import WAIT_RECHECK_S as WAIT_RECHECK_S
from hierplan.budgets.waiting import FundWaiters, until_freed
from hierplan.core.instrument import CallScope, Instrument
from hierplan.core.spend import Funds
from hierplan.core.views import Allocation, NodeView, RunView
from hierplan.errors import BudgetExceeded, RunSkipped, UserInputError
from hierplan.models.base import ModelRequest
from hierplan.models.counting import RESERVATIONS, Reservation
from hierplan.pricing import PriceTable
from hierplan.records import NodeRecord
from hierplan.units import PICO_PER_USD

DEFAULT_MIN_OUTPUT_FRACTION = 0.125
"""How far a call's ``max_tokens`` may be lowered to fit what is left. A planner told its
budget writes a plan that fits the answer it may write, so a low floor mostly lets a late,
short call (a continuation that covers what a plan left out, a repair) go out instead of being
refused. An eighth rather than a quarter: over seeds 1-8 of the hierarchical data_migration
run (simulated, typical profile) at 30/50/70 % of its unbudgeted cost, tables done went from
1.3/2.1/4.0 to 1.8/3.5/6.9 on average and the budget used from 0.37/0.61/0.73 to
0.73/0.76/0.86."""


def unknown_price_message(priced_as: str) -> str:
    """The one-line error for a USD budget on a model without a price."""
    return (
        f"no price is known for model {priced_as!r}, so a USD budget cannot be enforced: give "
        "its price with --price-in/--price-out (USD per million tokens; RunSpec(price_in=..., "
        "price_out=...) in the library), or budget in tokens only (--budget-tokens; "
        "budget={'tokens': ...} in the library)"
    )


# Where a user sets each part of a run's budget, named in the messages about a bad value.
_BUDGET_OPTION = MappingProxyType(
    {
        "tokens": "--budget-tokens (budget={'tokens': ...} in the library)",
        "usd": "--budget-usd (budget={'usd': ...} in the library)",
    }
)


def run_budget(tokens: int | float | None, usd: float | None) -> Budget:
    """The :class:`Budget` of a run's :class:`~hierplan.BudgetSpec`; a bad value raises
    :class:`UserInputError` naming the option that set it."""
    for key, given in (("tokens", {"tokens": tokens}), ("usd", {"usd": usd})):
        try:
            Budget(**given)  # any value: it is checked here
        except UserInputError as exc:
            raise UserInputError(f"{_BUDGET_OPTION[key]}: {exc}") from None
    assert tokens is None or isinstance(tokens, int)  # Budget refuses a token count of 1.5
    return Budget(tokens, usd)


def prepare_budget(
    *,
    budget_usd: float | None,
    budget_tokens: int | float | None,
    allocation: str,
    pricing: PriceTable,
    reservation: str = "exact",
    models: list[str],
) -> BudgetInstrument | None:
    """The instrument for a run's budget (``usd``, ``tokens``), checked before anything
    runs: bad values and unknown prices under a USD budget raise :class:`UserInputError`."""
    if allocation not in ALLOCATIONS:
        raise UserInputError(
            f"unknown allocation {allocation!r}: choose one of {', '.join(ALLOCATIONS)}"
        )
    if reservation not in RESERVATIONS:
        raise UserInputError(
            f"unknown reservation {reservation!r}: choose one of {', '.join(RESERVATIONS)}"
        )
    if budget_usd is None and budget_tokens is None:
        return None
    instrument = BudgetInstrument(
        run_budget(budget_tokens, budget_usd),
        allocation=allocation,
        reservation=reservation,
    )
    instrument.check_prices(pricing, models)
    return instrument


class BudgetInstrument(Instrument):
    """Enforce a token and/or USD budget on a run, node by node.

    ``allocation`` says how a planner's budget is split among the sub-goals and steps of its
    plan: ``equal`` (each child that starts gets an equal part of what remains), ``weighted``
    (parts in proportion to the planner's per-step estimates), ``on-demand`` (children draw
    from the parent's pool, each capped at ``on_demand_fraction`` of what the parent had left
    when it started). ``min_output_fraction`` is the floor to which ``max_tokens`` may be
    lowered to fit a call. ``parent`` funds each run's root account from an account of
    ``ledger`` (a batch's global budget), instead of a fresh root. ``budget_options`` is where
    a user sets this budget, named in the message of a call the budget refused.
    ``reservation`` is how a call's input is counted before it goes out (``exact``, ``bound``
    or ``estimate``; see :mod:`hierplan.models.counting`).

    When ``parent`` cannot grant a run its budget now (other runs hold it), the run is
    **skipped**: it ends with status ``skipped`` and reason ``budget``, without raising. With
    ``wait_for_budget`` its root waits instead until the parent can grant it (woken when the
    ledger gives something back; a ledger shared between processes is looked at every
    :data:`SHARED_LEDGER_POLL_S`), for at most ``wait_timeout_s`` seconds (``None``: until
    the run is cancelled), and is skipped if it still cannot start then.

    The instrument holds only this configuration: one instrument may serve many runs, at once
    or one after another, and each run gets its own :class:`RunBudget` (its root account, its
    spend, its prices) when it starts (:meth:`for_run`). Without ``parent`` each run gets the
    whole budget; runs that should share one budget share a ledger and a parent account.

    >>> instrument = BudgetInstrument(Budget(tokens=50_000, usd=0.05), allocation="weighted")
    """

    def __init__(
        self,
        budget: Budget,
        *,
        allocation: str = DEFAULT_ALLOCATION,
        ledger: Ledger | None = None,
        on_demand_fraction: float = DEFAULT_ON_DEMAND_FRACTION,
        min_output_fraction: float = DEFAULT_MIN_OUTPUT_FRACTION,
        parent: Account | None = None,
        budget_options: str = BUDGET_OPTIONS,
        reservation: Reservation = "exact",
        wait_for_budget: bool = False,
        wait_timeout_s: float | None = None,
    ) -> None:
        if allocation not in ALLOCATIONS:
            raise UserInputError(
                f"unknown allocation {allocation!r}: choose one of {', '.join(ALLOCATIONS)}"
            )
        for label, value in (
            ("on_demand_fraction", on_demand_fraction),
            ("min_output_fraction", min_output_fraction),
        ):
            if not 0.0 < value <= 1.0:
                raise UserInputError(f"{label} must be above 0 and at most 1, not {value!r}")
        if wait_timeout_s is not None and (
            isinstance(wait_timeout_s, bool)
            or not isinstance(wait_timeout_s, int | float)
            or not wait_timeout_s >= 0
        ):
            raise UserInputError(
                f"wait_timeout_s must be a number of seconds, 0 or more, not {wait_timeout_s!r}"
            )
        self.budget = budget
        self.allocation = allocation
        self.ledger: Ledger = ledger or LocalLedger()
        self.on_demand_fraction = on_demand_fraction
        self.min_output_fraction = min_output_fraction
        self.parent = parent
        self.budget_options = budget_options
        self.reservation = reservation
        self.wait_for_budget = wait_for_budget
        self.wait_timeout_s = wait_timeout_s
        # Keys of this instrument's entries in a node's state (which is the run's own).
        self.shares_key = object()
        self.counts_key = object()

    def check_prices(self, pricing: PriceTable, models: list[str]) -> None:
        """Fail closed before a run: a USD budget needs a price for every model
        (``priced_as``) of the run; raises :class:`UserInputError` naming the first without."""
        if self.budget.usd is None:
            return
        for priced_as in models:
            if pricing.lookup(priced_as) is None:
                raise UserInputError(unknown_price_message(priced_as))

    def for_run(self, run: RunView) -> RunBudget:
        """The budget state of ``run``: made the first time (as the run starts), the same
        object after, and never shared with another run."""
        found = run.state.get(self)
        if isinstance(found, RunBudget):
            return found
        made = run.state[self] = RunBudget(self, run)
        return made

    def output_floor(self, max_tokens: int) -> int:
        """The least ``max_tokens`` a call may be lowered to."""
        return max(1, min(max_tokens, math.ceil(max_tokens * self.min_output_fraction)))

    # -- the Instrument seam -------------------------------------------------------------

    def run_scope(self, run: RunView) -> AbstractAsyncContextManager[None] | None:
        """Give the run its own budget state, and check prices before anything runs (a USD
        budget fails closed on an unknown price)."""
        budget = self.for_run(run)
        budget.check_prices(
            run.pricing, [run.planner_model.priced_as, run.executor_model.priced_as]
        )
        return None

    def call_scope(self, node: NodeView, request: ModelRequest) -> CallScope | None:
        """Reserve before the call, settle after (see :mod:`hierplan.budgets.calls`)."""
        return BudgetCallScope(self.for_run(node.run), node)

    def node_scope(self, node: NodeView) -> AbstractAsyncContextManager[None] | None:
        """Open the node's account for its life (a step that only calls a tool needs none)."""
        work = node.work
        if work is not None and work.direct:
            return None
        return _NodeBudget(self.for_run(node.run), node)

    async def funds(self, node: NodeView) -> Funds | None:
        """What the node's account could reserve now, with the run's prices and floor."""
        budget = self.for_run(node.run)
        account = self.account(node)
        tokens, pico = await budget.ledger.available(account)
        run = node.run
        return Funds(
            tokens=tokens,
            pico=pico,
            usd_tracked=budget.usd_tracked,
            planner_rates=budget.worst_case_rates(run.planner_model.priced_as),
            executor_rates=budget.worst_case_rates(run.executor_model.priced_as),
            min_output_fraction=self.min_output_fraction,
        )

    def account(self, node: NodeView) -> Account:
        """The account a node's calls are charged to: its own, else its nearest ancestor's."""
        account = self.owner(node).state.get(self)
        assert isinstance(account, Account)
        return account

    def owner(self, node: NodeView) -> NodeView:
        """The node whose account ``node``'s calls are charged to: itself, else its nearest
        ancestor with one (a step that only calls a tool has none, until its tool's call is
        decided again)."""
        found: NodeView | None = node
        while found is not None:
            if isinstance(found.state.get(self), Account):
                return found
            found = found.parent
        raise BudgetExceeded(f"node {node.path} has no budget account (the run has no root)")


class RunBudget:
    """One run's budget under a :class:`BudgetInstrument`: the prices of its models, its root
    account and final balance, and what a paused run spent before it went on. Made by
    :meth:`BudgetInstrument.for_run` when the run starts."""

    def __init__(self, instrument: BudgetInstrument, run: RunView) -> None:
        self.instrument = instrument
        self.ledger = instrument.ledger
        self.counts_key = instrument.counts_key
        self.pricing = run.pricing
        self.usd_tracked = True
        self.root: Account | None = None
        self.root_balance: Balance | None = None
        # Whether any call of the run has reserved yet: a refusal before that means the
        # budget cannot start the run at all.
        self.reserved_any = False
        # What a call short of funds under the ``need`` allocation waits on.
        self.waiters = FundWaiters()
        # The accounts open now, by node path, and the run's tree of records (a closed node's
        # figures are in its record): what a snapshot reads.
        self.open_accounts: dict[str, Account] = {}
        self.tree: NodeRecord | None = None
        self._worst_case: dict[str, tuple[int, int]] = {}
        # A resumed run goes on with what the paused part left: both parts share the budget.
        resumed = run.resumed
        self.resumed = resumed is not None
        self.before_tokens = 0 if resumed is None else resumed.spent_tokens
        self.before_pico = 0 if resumed is None else resumed.spent_pico

    # -- prices --------------------------------------------------------------------------

    def check_prices(self, pricing: PriceTable, models: list[str]) -> None:
        """Fail closed: a USD budget needs a price for every model (``priced_as``) of the run;
        without one, a model without a price only means that USD spend is not known."""
        self.pricing = pricing
        self._worst_case.clear()
        for priced_as in models:
            if pricing.rates(priced_as) is not None:
                continue
            if self.instrument.budget.usd is not None:
                raise UserInputError(unknown_price_message(priced_as))
            self.usd_tracked = False

    def worst_case_rates(self, priced_as: str) -> tuple[int, int]:
        """Pico-dollars per input and per output token of ``priced_as`` (0 without a price):
        what a call's worst case is reserved at."""
        found = self._worst_case.get(priced_as)
        if found is None:
            rates = self.pricing.rates(priced_as)
            found = self._worst_case[priced_as] = (
                (0, 0) if rates is None else (rates.input, rates.output)
            )
        return found

    def usd(self, pico: int) -> float | None:
        """``pico`` as USD, or ``None`` when the run's USD spend is not known."""
        return pico / PICO_PER_USD if self.usd_tracked else None

    def amount(self, tokens: int | None, pico: int | None) -> str:
        """An amount as a refusal's message shows it: in the dimensions the budget limits (a
        USD-only budget's message names USD only)."""
        limits = self.instrument.budget
        return amount_text(
            None if limits.tokens is None else tokens,
            None if limits.usd is None else pico,
            self.usd_tracked,
        )

    def counts(self, node: NodeView) -> CallCounts:
        """The node's counts of lowered and refused calls."""
        state = node.state
        counts = state.get(self.counts_key)
        if not isinstance(counts, CallCounts):
            counts = state[self.counts_key] = CallCounts()
        return counts

    def root_grant(self) -> Fixed:
        """The root's allocation: the budget, less what a paused run spent before."""
        budget = self.instrument.budget
        tokens, pico = budget.tokens, budget.pico
        return Fixed(
            None if tokens is None else max(0, tokens - self.before_tokens),
            None if pico is None else max(0, pico - self.before_pico),
        )

    def output_floor(self, max_tokens: int) -> int:
        """The least ``max_tokens`` a call may be lowered to."""
        return self.instrument.output_floor(max_tokens)

    # -- accounts ------------------------------------------------------------------------

    def account(self, node: NodeView) -> Account:
        """The account a node's calls are charged to: its own, else its nearest ancestor's."""
        return self.instrument.account(node)

    def owner(self, node: NodeView) -> NodeView:
        """The node whose account ``node``'s calls are charged to."""
        return self.instrument.owner(node)

    async def snapshot(self) -> dict[str, AccountSnapshot]:
        """Every node's account now, open and closed, by node path in the order of the tree
        (parents before children); nodes without an account of their own (a step that only
        calls a tool, a node not started yet) are left out.

        On a :class:`LocalLedger` the figures are taken at one moment (nothing awaits); on a
        ledger that waits for I/O, account by account."""
        return await snapshot_of(self.ledger, self.open_accounts, self.tree, self.usd_tracked)

    def grant(self, node: NodeView) -> Grant:
        """How a (non-root) node's account is funded from its parent's."""
        instrument = self.instrument
        if instrument.allocation == "on-demand":
            return Draw(instrument.on_demand_fraction)
        assert node.parent is not None
        fraction = self._share(node.parent, node)
        return Share(fraction, fraction)

    def _share(self, parent: NodeView, child: NodeView) -> float:
        """The child's part of what its parent has left: its weight over the weights of the
        steps of the parent's current plan that have not started yet (itself included).

        Computed once per plan version, then O(1) per child."""
        work = child.work
        if work is None:
            return 1.0
        shares: _Shares | None = parent.state.get(self.instrument.shares_key)
        needs = None
        if shares is None or not shares.current(parent):
            needs = parent.plan_needs(include=work.step_id)
            if needs is None:
                return 1.0
            weights = step_weights(
                needs.steps,
                self.instrument.allocation,
                needs.least,
                usd=self.instrument.budget.usd is not None,
            )
            shares = _Shares(needs.version, weights)
            parent.state[self.instrument.shares_key] = shares
        weight = shares.weights.pop(work.step_id, None)
        if weight is None:  # not a step of the current plan: an even part of what is left
            return 1.0 / (1 + len(shares.weights))
        left = shares.left
        shares.left = max(0.0, left - weight)
        if left <= 0.0 or weight >= left:
            return 1.0
        return weight / left

    def record(self, balance: Balance, node: NodeView) -> dict[str, Any]:
        """A balance as the node's ``record.budget``: one flat mapping, so that exporters can
        take every figure as it is (USD figures are ``None`` when USD is not tracked).

        ``limit``: what the node may spend; ``allocated``: what it took from its planner;
        ``peak_reserved``: the most it held for calls at once; ``spent``: its subtree's usage;
        ``released``: what went back; ``overrun``: usage above reservations. ``planning_*`` and
        ``execution_*``: what its own calls spent per phase. ``lowered``: calls whose
        ``max_tokens`` was lowered to fit; ``refused``: calls not made."""
        # One literal, built once per node: this runs for every leaf.
        plan_t, plan_p = balance.own["planning"]
        exec_t, exec_p = balance.own["execution"]
        counts = node.state.get(self.counts_key)
        usd = self.usd_tracked
        return {
            "policy": self.instrument.allocation,
            "grant": balance.grant,
            "limit_tokens": balance.limit_tokens,
            "allocated_tokens": balance.allocated_tokens,
            "peak_reserved_tokens": balance.peak_reserved_tokens,
            "spent_tokens": balance.spent_tokens,
            "released_tokens": balance.released_tokens,
            "overrun_tokens": balance.overrun_tokens,
            "limit_usd": _usd(balance.limit_pico) if usd else None,
            "allocated_usd": _usd(balance.allocated_pico) if usd else None,
            "peak_reserved_usd": balance.peak_reserved_pico / PICO_PER_USD if usd else None,
            "spent_usd": balance.spent_pico / PICO_PER_USD if usd else None,
            "released_usd": _usd(balance.released_pico) if usd else None,
            "overrun_usd": balance.overrun_pico / PICO_PER_USD if usd else None,
            "planning_tokens": plan_t,
            "planning_usd": plan_p / PICO_PER_USD if usd else None,
            "execution_tokens": exec_t,
            "execution_usd": exec_p / PICO_PER_USD if usd else None,
            "lowered": counts.lowered if counts else 0,
            "refused": counts.refused if counts else 0,
        }

    def summary(self, tree: NodeRecord) -> dict[str, Any]:
        """The run's budget for the run record: limits, spend, and rollups per level and phase.

        Levels sum the budgets of the nodes at each depth (each covers its subtree); phases sum
        what the calls of every node spent while planning and while executing.
        """
        usd = self.usd_tracked
        phase_tokens = {"planning": 0, "execution": 0}
        # USD is summed in pico-dollars, the figures' exact unit (a record's USD figure was
        # written from them, so int(usd * _PICO_F + 0.5) gives them back exactly), so that the
        # sums do not drift as floats added one by one do: the run's total is exact, and so
        # must its parts be.
        phase_pico = {"planning": 0, "execution": 0}
        levels: dict[int, dict[str, Any]] = {}
        exhausted: list[str] = []
        refused = lowered = over_t = 0
        over_pico = 0
        for node in tree.walk():
            if node.status == "budget_exhausted":
                exhausted.append(node.path)
            for call in node.calls:
                phase_tokens[call.phase] += call.usage.total_tokens
                cost = call.cost_usd
                if cost:  # inline, not a helper's call: this runs for every call of the run
                    phase_pico[call.phase] += int(cost * _PICO_F + 0.5)
            b = node.budget
            if b is None:
                continue
            row = levels.get(node.depth)
            if row is None:
                row = levels[node.depth] = _level_row(node.depth, usd)
            row["nodes"] += 1
            row["allocated_tokens"] += b["allocated_tokens"] or 0
            row["spent_tokens"] += b["spent_tokens"]
            refused += b["refused"]
            lowered += b["lowered"]
            over_t += b["overrun_tokens"]
            if usd:  # in pico-dollars until the end (see _level_row), inline as for calls
                allocated, over = b["allocated_usd"], b["overrun_usd"]
                if allocated:
                    row["allocated_usd"] += int(allocated * _PICO_F + 0.5)
                row["spent_usd"] += int(b["spent_usd"] * _PICO_F + 0.5)
                if over:
                    over_pico += int(over * _PICO_F + 0.5)
        if usd:
            for row in levels.values():
                row["allocated_usd"] /= PICO_PER_USD
                row["spent_usd"] /= PICO_PER_USD
        phases = {
            p: {"tokens": phase_tokens[p], "usd": phase_pico[p] / PICO_PER_USD if usd else None}
            for p in phase_tokens
        }
        root, budget = self.root_balance, self.instrument.budget
        spent_t = (root.spent_tokens if root else 0) + self.before_tokens
        spent_p = (root.spent_pico if root else 0) + self.before_pico
        return {
            "policy": self.instrument.allocation,
            "limit": {"tokens": budget.tokens, "usd": budget.usd},
            # ``pico``: the exact figure, which a resumed run carries over.
            "spent": {
                "tokens": spent_t,
                "usd": spent_p / PICO_PER_USD if usd else None,
                "pico": spent_p if usd else None,
            },
            "usd_tracked": usd,
            "phases": phases,
            "levels": [levels[d] for d in sorted(levels)],
            "exhausted": exhausted,
            "refused_calls": refused,
            "lowered_calls": lowered,
            "overrun": {"tokens": over_t, "usd": over_pico / PICO_PER_USD if usd else None},
            "on_demand_fraction": self.instrument.on_demand_fraction,
            "min_output_fraction": self.instrument.min_output_fraction,
        }


def _level_row(depth: int, usd: bool) -> dict[str, Any]:
    """A level's row; its USD figures are summed as whole pico-dollars (int 0, not 0.0: a
    float would make the sum inexact) and turned into USD once every node is in."""
    return {
        "depth": depth,
        "nodes": 0,
        "allocated_tokens": 0,
        "spent_tokens": 0,
        "allocated_usd": 0 if usd else None,
        "spent_usd": 0 if usd else None,
    }


# Pico-dollars a USD as a float: a figure times it, rounded, is its whole pico-dollars again
# (int(x + 0.5) rather than round(x): the figures are not negative, and it costs less).
_PICO_F = float(PICO_PER_USD)


def _usd(pico: int | None) -> float | None:
    return None if pico is None else pico / PICO_PER_USD


class _Shares:
    """Weights of a plan version's steps that have not started yet."""

    __slots__ = ("left", "version", "weights")

    def __init__(self, version: int, weights: dict[str, float]) -> None:
        self.version = version
        self.weights = weights
        self.left = sum(weights.values())

    def current(self, node: NodeView) -> bool:
        """Whether these are the weights of the node's current plan version."""
        return self.version == len(node.record.plan_versions)


class _NodeBudget(AbstractAsyncContextManager[None]):
    """Opens a node's account when the node starts; closes it (and records it) at the end."""

    __slots__ = ("account", "node", "prior", "run_budget")

    def __init__(self, run_budget: RunBudget, node: NodeView) -> None:
        self.run_budget = run_budget
        self.node = node
        self.account: Account | None = None
        # A node that goes on after a pause: what its account showed when the run paused
        # (its allocation, what it had spent), to which this part's figures are added.
        self.prior = node.record.budget if run_budget.resumed else None

    async def __aenter__(self) -> None:
        if self.node.parent is None:
            self.run_budget.tree = self.node.record
            if self.run_budget.instrument.parent is not None:
                await self._open_funded_root()
                return
        await self._open()

    async def _open(self) -> None:
        ledger = self.run_budget.ledger
        if type(ledger) is LocalLedger:
            # No await: nothing can come between carving the allocation and registering it.
            opened = ledger.open_now(*self._funding())
            planner = self.node.record.kind == "planner"
            self._opened(opened, ledger.balance_now(opened) if planner else None)
            return
        # A ledger that waits for I/O could be cancelled after it carved the allocation but
        # before the account is registered here (and so closed by __aexit__): the allocation
        # would never go back to the parent. Shielded, the cancellation lands in the node's
        # body instead, and __aexit__ closes the account.
        with anyio.CancelScope(shield=True):
            account = await ledger.open(*self._funding())
            try:
                # A planner sees its budget; node_started says what a node was given (a local
                # account says it without a look at the ledger).
                wanted = self.node.record.kind == "planner" or (
                    not isinstance(account, LocalAccount)
                    and self.node.run.bus.wants("node_started")
                )
                balance = await ledger.balance(account) if wanted else None
            except BaseException:
                await ledger.close(account)  # __aexit__ will not run: give the allocation back
                raise
            self._opened(account, balance)

    async def _open_funded_root(self) -> None:
        """Open the run's root account from the instrument's parent account: at once, or
        with ``wait_for_budget`` once the parent can grant it (up to ``wait_timeout_s``);
        otherwise the run is skipped (:class:`RunSkipped`, reason ``budget``)."""
        instrument = self.run_budget.instrument
        timeout = instrument.wait_timeout_s
        deadline = None if timeout is None else anyio.current_time() + timeout
        while True:
            try:
                await self._open()
                return
            except BudgetExceeded as exc:
                refused = str(exc)
            if not instrument.wait_for_budget or (
                deadline is not None and anyio.current_time() >= deadline
            ):
                break
            await until_freed(self.run_budget.ledger, deadline)
        waited = f" (waited {timeout:g} s)" if instrument.wait_for_budget and timeout else ""
        raise RunSkipped(
            f"budget: the run's budget ({instrument.budget}) cannot be granted now: "
            f"{refused}{waited}; the run did not start",
            reason="budget",
        )

    def _funding(self) -> tuple[str, Account | None, Grant]:
        budget = self.run_budget
        node = self.node
        if node.parent is None:
            return node.path, budget.instrument.parent, budget.root_grant()
        return node.path, budget.account(node.parent), budget.grant(node)

    def _opened(self, account: Account, balance: Balance | None) -> None:
        """Register the open account; a planner sees its budget while it plans (the gate too),
        and the node's ``node_started`` event says what it was given."""
        budget = self.run_budget
        node = self.node
        self.account = account
        node.state[budget.instrument] = account
        budget.open_accounts[node.path] = account
        if node.parent is None:
            budget.root = account
        if node.record.kind != "executor" and balance is not None:
            node.record.budget = _continued(self.prior, budget.record(balance, node))
        if node.run.bus.wants("node_started"):
            node.allocation = _allocation(budget, account, balance)

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        account = self.account
        if account is None:
            return
        budget = self.run_budget
        ledger = budget.ledger
        if type(ledger) is LocalLedger:
            balance = ledger.close_now(account)
        else:
            balance = await ledger.close(account)
        self.node.record.budget = _continued(self.prior, budget.record(balance, self.node))
        budget.waiters.account_closed()
        budget.open_accounts.pop(self.node.path, None)
        if self.node.parent is None:
            budget.root_balance = balance


def _allocation(budget: RunBudget, account: Account, balance: Balance | None) -> Allocation:
    """What a node was given, from its balance, or from a local account's own figures."""
    if balance is not None:
        tokens, pico = balance.limit_tokens, balance.limit_pico
    elif isinstance(account, LocalAccount):
        tokens, pico = account.limit_t, account.limit_p
    else:
        return Allocation(None, None)
    return Allocation(tokens, None if pico is None else budget.usd(pico))
