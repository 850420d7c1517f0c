"""A model call under a node's budget: reserve before it goes out, settle after.

1. reserve the worst case: the request's estimated input (with the input the provider adds on
   its own) plus ``max_tokens``, priced by the run's price table for the model's
   ``priced_as``;
2. if that does not fit, lower ``max_tokens`` to what fits, down to a floor; below the floor
   the call is not made and :class:`~hierplan.errors.BudgetExceeded` is raised;
3. after the call, settle what its :class:`~hierplan.core.calls.CallOutcome` counts (a failed
   call's usage counts; a reply without usage, or a call cut short, counts at the reserved
   worst case); usage above the reservation is charged all the same, flagged ``overrun`` and
   reported. A call that used nothing releases its reservation.

Each attempt of a retried call is reserved and settled on its own.
:class:`~hierplan.budgets.instrument.BudgetInstrument` opens one :class:`BudgetCallScope` per
attempt.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import anyio

from hierplan.budgets.budget import Account, Reservation
from hierplan.budgets.ledger import LocalLedger
from hierplan.core.calls import CallOutcome
from hierplan.core.events import BudgetExhausted, BudgetOverrun, BudgetReserved, BudgetSettled
from hierplan.core.instrument import CallScope
from hierplan.core.spend import Cost
from hierplan.core.views import NodeView
from hierplan.errors import BudgetExceeded, BudgetTooSmall
from hierplan.models.base import ModelRequest
from hierplan.units import PICO_PER_USD, pico_to_usd

if TYPE_CHECKING:
    from hierplan.budgets.instrument import RunBudget

# Where a user sets a run's budget, named in the message of a call the budget refused.
BUDGET_OPTIONS = "--budget-tokens / --budget-usd (budget= in the library)"


# Tokens of room for the prompt's budget line, whose figures grow by a digit or two when the
# budget named as the smallest is given: that budget must still start the run.
BUDGET_LINE_ROOM = 16


def _smallest_budget(need_t: int, need_p: int, rate_in: int) -> Cost:
    """The smallest budget that pays a first call needing ``need_t`` / ``need_p``: with room
    for the budget line, and pico-dollars rounded up to the millionth of a dollar a message
    shows."""
    tokens = need_t + BUDGET_LINE_ROOM
    pico = need_p + BUDGET_LINE_ROOM * rate_in
    step = PICO_PER_USD // 1_000_000
    return Cost(tokens, -(-pico // step) * step)


class CallCounts:
    """Calls of one node whose ``max_tokens`` was lowered, and calls refused."""

    __slots__ = ("lowered", "refused")

    def __init__(self) -> None:
        self.lowered = 0
        self.refused = 0


class BudgetCallScope(CallScope):
    """One attempt of a model call under the node's budget (see the module docstring)."""

    __slots__ = ("budget", "node", "rate_in", "rate_out", "reservation")

    def __init__(self, budget: RunBudget, node: NodeView) -> None:
        self.budget = budget
        self.node = node
        self.reservation: Reservation | None = None
        self.rate_in, self.rate_out = budget.worst_case_rates(node.base_model.priced_as)

    async def start(self, request: ModelRequest, estimate: int) -> ModelRequest:
        """Reserve the call's worst case, lowering ``max_tokens`` to fit, or refuse it."""
        account = self.budget.account(self.node)
        wanted = request.max_tokens
        tokens, pico = estimate + wanted, estimate * self.rate_in + wanted * self.rate_out
        ledger = self.budget.ledger
        # The in-memory ledger is called directly, not through its coroutine: one call of
        # every leaf's, about 2 % of a leaf's instructions (benchmarks/instructions.py).
        if isinstance(ledger, LocalLedger):
            reservation = ledger.reserve_now(account, tokens, pico, request.phase)
        else:
            reservation = await ledger.reserve(account, tokens, pico, request.phase)
        if reservation is None:
            reservation, request = await self._fit(account, request, estimate)
        self.reservation = reservation
        budget = self.budget
        budget.reserved_any = True
        budget.waiters.in_flight += 1
        bus = self.node.run.bus
        if bus.wants("budget_reserved"):
            bus.emit(
                BudgetReserved(
                    run_id=bus.run_id,
                    path=self.node.path,
                    phase=request.phase,
                    tokens=reservation.tokens,
                    usd=self.budget.usd(reservation.pico),
                    max_tokens=request.max_tokens,
                    requested_max_tokens=wanted,
                )
            )
        return request

    async def end(self, outcome: CallOutcome) -> None:
        """Settle what the call counts for, or release what it held when it used nothing."""
        reservation = self.reservation
        if reservation is None:
            return  # refused, or cancelled before anything was held
        try:
            await self._settle(reservation, outcome)
        finally:
            self.budget.waiters.call_ended()

    async def _settle(self, reservation: Reservation, outcome: CallOutcome) -> None:
        ledger = self.budget.ledger
        usage = outcome.usage
        if usage is None:
            await ledger.release(reservation)
            flags = ["failed", "released"] if outcome.made else ["released"]
            await self._settled(reservation, 0, 0, flags)
            return
        tokens = usage.input_tokens + usage.output_tokens
        pico = outcome.cost_pico or 0
        if isinstance(ledger, LocalLedger):  # directly, as in start()
            ledger.settle_now(reservation, tokens, pico)
        else:
            await ledger.settle(reservation, tokens, pico)
        flags = _settled_flags(outcome.flags)
        if tokens > reservation.tokens or pico > reservation.pico:
            flags.append("overrun")
            self._overrun(reservation, tokens, pico, outcome)
        await self._settled(reservation, tokens, pico, flags)

    def _overrun(
        self, reservation: Reservation, tokens: int, pico: int, outcome: CallOutcome
    ) -> None:
        outcome.flags.append("overrun")
        if outcome.response is not None:
            outcome.response.flags.append("overrun")
        record = self.node.record
        if "overrun" not in record.flags:
            record.flags.append("overrun")
        bus = self.node.run.bus
        if bus.wants("budget_overrun"):
            bus.emit(
                BudgetOverrun(
                    run_id=bus.run_id,
                    path=self.node.path,
                    phase=reservation.phase,
                    tokens_over=max(0, tokens - reservation.tokens),
                    usd_over=self.budget.usd(max(0, pico - reservation.pico)),
                )
            )

    async def _settled(
        self, reservation: Reservation, tokens: int, pico: int, flags: list[str]
    ) -> None:
        """Say what the call was settled at, and where its account stands now."""
        bus = self.node.run.bus
        if not bus.wants("budget_settled"):
            return
        budget = self.budget
        ledger = budget.ledger
        account = reservation.account
        if isinstance(ledger, LocalLedger):  # directly, as in start()
            balance = ledger.balance_now(account)
            avail_t, avail_p = ledger.available_now(account)
        else:
            # Settled already: a cancellation now must not lose the event that says so.
            with anyio.CancelScope(shield=True):
                balance = await ledger.balance(account)
                avail_t, avail_p = await ledger.available(account)
        usd = budget.usd
        bus.emit(
            BudgetSettled(
                run_id=bus.run_id,
                path=self.node.path,
                phase=reservation.phase,
                tokens=tokens,
                usd=usd(pico),
                reserved_tokens=reservation.tokens,
                reserved_usd=usd(reservation.pico),
                flags=flags,
                spent_tokens=balance.spent_tokens,
                spent_usd=usd(balance.spent_pico),
                held_tokens=balance.reserved_tokens,
                held_usd=usd(balance.reserved_pico),
                remaining_tokens=avail_t,
                remaining_usd=None if avail_p is None else usd(avail_p),
            )
        )

    async def _fit(
        self, account: Account, request: ModelRequest, estimate: int
    ) -> tuple[Reservation, ModelRequest]:
        """Lower ``max_tokens`` to what the budget has left, down to the floor; under the
        ``need`` allocation, take what the call lacks from the parent's free funds or wait
        for what other nodes return; else raise."""
        budget = self.budget
        floor = budget.output_floor(request.max_tokens)
        need_t = estimate + floor
        need_p = estimate * self.rate_in + floor * self.rate_out
        while True:
            fitted, avail_t, avail_p = await self._lowered(account, request, estimate, floor)
            if fitted is not None:
                return fitted
            short_t = 0 if avail_t is None else max(0, need_t - avail_t)
            short_p = 0 if avail_p is None else max(0, need_p - avail_p)
            if not await self._more_funds(account, short_t, short_p):
                break
        owner = budget.owner(self.node)
        budget.counts(owner).refused += 1
        self._exhausted(request, need_t, need_p, avail_t, avail_p)
        needs = (
            f"its {request.phase} call needs at least {budget.amount(need_t, need_p)} "
            f"(max_tokens lowered to {floor:,}) but {budget.amount(avail_t, avail_p)} remain; "
            "the call was not made"
        )
        if self._nothing_spent():
            smallest = budget.amount(*_smallest_budget(need_t, need_p, self.rate_in))
            raise BudgetTooSmall(
                f"the run's budget cannot pay for its first call: node {self.node.path} is "
                f"out of budget before anything was spent: {needs}. The smallest budget "
                f"that starts this run is {smallest}: give the run a larger budget with "
                f"{budget.instrument.budget_options}"
            )
        node = self.node.path
        if owner is not self.node:  # a tool step's call, charged to its planner's account
            node = f"{node} (on the account of node {owner.path})"
        raise BudgetExceeded(
            f"node {node} is out of budget: {needs} (give the run a larger budget "
            f"with {budget.instrument.budget_options}, or this node a larger share)"
        )

    async def _lowered(
        self, account: Account, request: ModelRequest, estimate: int, floor: int
    ) -> tuple[tuple[Reservation, ModelRequest] | None, int | None, int | None]:
        """Reserve with ``max_tokens`` lowered to what is available, if that is at least
        ``floor``; else ``None`` with what was available."""
        budget = self.budget
        ledger = budget.ledger
        input_pico = estimate * self.rate_in
        avail_t: int | None = None
        avail_p: int | None = None
        # A shared ledger may hand what looked available to another process between the two
        # calls below; try again a few times before giving up.
        for _ in range(3):
            avail_t, avail_p = await ledger.available(account)
            fits = request.max_tokens
            if avail_t is not None:
                fits = min(fits, avail_t - estimate)
            if avail_p is not None:
                rest = avail_p - input_pico
                if self.rate_out:
                    fits = min(fits, rest // self.rate_out)
                elif rest < 0:
                    fits = -1
            if fits < floor:
                break
            reservation = await ledger.reserve(
                account, estimate + fits, input_pico + fits * self.rate_out, request.phase
            )
            if reservation is not None:
                budget.counts(budget.owner(self.node)).lowered += 1
                return (reservation, request.with_max_tokens(fits)), avail_t, avail_p
        return None, avail_t, avail_p

    async def _more_funds(self, account: Account, short_t: int, short_p: int) -> bool:
        """Under the ``need`` allocation: whether the account got more to try again with,
        taken from its parent's free funds, or after waiting for other nodes to return theirs
        (only while some other node is still at work, or another waiting node that lacks more gives
        up: else nothing more will come)."""
        budget = self.budget
        if budget.instrument.allocation != "need":
            return False
        if await budget.ledger.top_up(account, short_t, short_p):
            return True
        short = (short_p, short_t)
        waiters = budget.waiters
        if not waiters.others_working(self.node) and not waiters.yield_to(short):
            return False
        return await waiters.returns(self.node, short)

    def _nothing_spent(self) -> bool:
        """Whether the run has reserved nothing yet, on a budget of its own (not a shared
        parent's, which may only be short for now, nor a resumed run's remainder): then the
        refused call is its first, and no budget smaller than the call's least starts the
        run."""
        budget = self.budget
        return not (budget.reserved_any or budget.instrument.parent is not None or budget.resumed)

    def _exhausted(
        self,
        request: ModelRequest,
        need_t: int,
        need_p: int,
        avail_t: int | None,
        avail_p: int | None,
    ) -> None:
        bus = self.node.run.bus
        if bus.wants("budget_exhausted"):
            usd = self.budget.usd
            bus.emit(
                BudgetExhausted(
                    run_id=bus.run_id,
                    path=self.node.path,
                    phase=request.phase,
                    needed_tokens=need_t,
                    needed_usd=usd(need_p),
                    available_tokens=avail_t,
                    available_usd=None if avail_p is None else usd(avail_p),
                )
            )


def _settled_flags(flags: list[str]) -> list[str]:
    """The flags a settlement reports for a call's outcome flags."""
    if "cut_short" in flags:
        return ["cut_short"]
    if "failed" in flags:
        return ["failed", *(f for f in ("no_usage", "invalid_usage") if f in flags)]
    return ["no_usage"] if "no_usage" in flags else []


def amount_text(tokens: int | None, pico: int | None, usd_tracked: bool) -> str:
    """An amount as a message shows it: ``1,234 tokens / $0.000100``, or ``no limit``."""
    parts = []
    if tokens is not None:
        parts.append(f"{tokens:,} tokens")
    if pico is not None and usd_tracked:
        parts.append(f"${pico_to_usd(pico):.6f}")
    return " / ".join(parts) or "no limit"
