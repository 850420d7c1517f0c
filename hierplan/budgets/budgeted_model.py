"""The model wrapper of a node under a budget: reserve before every call, settle after.

1. reserve the worst case: estimated input tokens (with the input the provider adds on its own,
   see :func:`~hierplan.models.tokens.estimate_input_tokens`) plus ``max_tokens``, priced
   by the run's price table for the model's ``priced_as``;
2. if that does not fit, lower ``max_tokens`` to what fits, down to a floor; below the floor the
   call is not made and :class:`~hierplan.errors.BudgetExceeded` is raised;
3. after the call, settle the actual usage (a failed call's usage counts; a response without
   usage settles at the reserved worst case and is flagged ``no_usage``; usage above the
   reservation is charged, flagged ``overrun`` and reported; a failure the provider may have
   billed without saying how much, a timeout say, settles at the worst case, flagged
   ``no_usage``); a call cut short (cancelled, a deadline) settles at its reservation, flagged
   ``cut_short``, since the provider may have billed it.

Retries pass through the wrapper one attempt at a time, so each attempt is reserved and settled
on its own. :class:`~hierplan.budgets.instrument.BudgetInstrument` puts it around every node's
model.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from anyio import get_cancelled_exc_class

from hierplan.budgets.budget import Account, LocalLedger, Reservation, pico_to_usd
from hierplan.core.events import BudgetExhausted, BudgetOverrun, BudgetReserved, BudgetSettled
from hierplan.errors import BudgetExceeded, ModelError
from hierplan.hierarchy.context import NodeContext
from hierplan.models.base import Model, ModelRequest, ModelResponse, Usage
from hierplan.models.tokens import counted_usage, estimate_input_tokens, failed_usage

# Where a user sets a run's budget, named in the message of a call the budget refused.
BUDGET_OPTIONS = "--budget-tokens / --budget-usd (budget_tokens= / budget_usd= in the library)"

if TYPE_CHECKING:
    from hierplan.budgets.instrument import RunBudget


class _Counts:
    """Calls of one node whose ``max_tokens`` was lowered, and calls refused."""

    __slots__ = ("lowered", "refused")

    def __init__(self) -> None:
        self.lowered = 0
        self.refused = 0


class BudgetedModel:
    """A model behind a node's budget (see the module docstring)."""

    __slots__ = (
        "_account",
        "_base",
        "_inner",
        "_instrument",
        "_local",
        "_node",
        "_rates",
        "name",
        "priced_as",
        "provider",
        "simulated",
    )

    def __init__(self, inner: Model, node: NodeContext, instrument: RunBudget) -> None:
        self._inner = inner
        self._base = node.base_model  # inner may be another instrument's wrapper
        self._node = node
        self._instrument = instrument
        self._account: Account | None = None
        self._rates = instrument.rates(inner.priced_as)
        # The in-memory ledger is called directly: no coroutine per reserve and settle.
        ledger = instrument.ledger
        self._local = ledger if type(ledger) is LocalLedger else None
        self.name = inner.name
        self.provider = inner.provider
        self.priced_as = inner.priced_as
        self.simulated = inner.simulated

    async def request(self, request: ModelRequest) -> ModelResponse:
        """Reserve, call, settle (see the module docstring)."""
        node = self._node
        node.held_tokens = 0  # until the request goes out, cancelling costs nothing
        account = self._account
        if account is None:
            account = self._account = self._instrument.account(node)
        ledger = self._instrument.ledger
        local = self._local
        rate_in, _, rate_out, _, _ = self._rates
        # With what the provider adds on its own (Anthropic's tool-use system prompt): without
        # it every Anthropic call with tools used more than it reserved.
        input_tokens = estimate_input_tokens(request, self._base)
        wanted = request.max_tokens
        tokens = input_tokens + wanted
        pico = input_tokens * rate_in + wanted * rate_out
        if local is not None:
            reservation = local.reserve_now(account, tokens, pico, request.phase)
        else:
            reservation = await ledger.reserve(account, tokens, pico, request.phase)
        if reservation is None:
            reservation, request = await self._fit(account, request, input_tokens)
        try:
            # Inside the try: a listener that raises must not leave the reservation open.
            bus = self._node.run.bus
            if bus.wants("budget_reserved"):
                bus.emit(
                    BudgetReserved(
                        run_id=bus.run_id,
                        path=self._node.path,
                        phase=request.phase,
                        tokens=reservation.tokens,
                        usd=self._usd(reservation.pico),
                        max_tokens=request.max_tokens,
                        requested_max_tokens=wanted,
                    )
                )
            node.held_tokens = reservation.tokens
            response = await self._inner.request(request)
        except ModelError as exc:
            used, flag = failed_usage(exc, request, input_tokens)
            if used is None:
                await self._release(reservation)
                self._settled(reservation, 0, 0, ["failed", "released"])
            else:
                if exc.usage is None:
                    # Counted at this request's worst case (its max_tokens may have been
                    # lowered to fit): the record outside counts the same figure.
                    exc.usage = used
                await self._settle(
                    reservation, used, ["failed"] if flag is None else ["failed", flag]
                )
            raise
        except get_cancelled_exc_class():
            # Cut short (cancelled, a deadline, Ctrl-C): the request may have reached the
            # provider, which bills what it took, so the call counts at what it held.
            await self._settle_held(reservation)
            raise
        except BaseException:
            # A failure outside the model's errors (a bug before the request went out): nothing
            # was used, the whole reservation goes back.
            await self._release(reservation)
            self._settled(reservation, 0, 0, ["released"])
            raise
        # A reply without usage settles at the reserved worst case; impossible usage as the
        # nearest possible, so that the reservation closes and the run goes on.
        missing = response.usage is None
        usage = counted_usage(response, request, input_tokens)
        flags = await self._settle(reservation, usage, ["no_usage"] if missing else [])
        if "overrun" in flags:
            response.flags.append("overrun")
        return response

    async def _settle(self, reservation: Reservation, usage: Usage, flags: list[str]) -> list[str]:
        rate_in, rate_cached, rate_out, rate_write, rate_write_1h = self._rates
        # usage is possible (see Usage.possible): reads and writes are parts of the input
        cached = usage.cached_input_tokens
        written = usage.cache_write_tokens
        hour = usage.cache_write_1h_tokens
        tokens = usage.input_tokens + usage.output_tokens
        pico = (
            (usage.input_tokens - cached - written) * rate_in
            + cached * rate_cached
            + (written - hour) * rate_write
            + hour * rate_write_1h
            + usage.output_tokens * rate_out
        )
        local = self._local
        if local is not None:
            local.settle_now(reservation, tokens, pico)
        else:
            await self._instrument.ledger.settle(reservation, tokens, pico)
        if tokens > reservation.tokens or pico > reservation.pico:
            flags.append("overrun")
            self._overrun(reservation, tokens, pico)
        self._settled(reservation, tokens, pico, flags)
        return flags

    async def _settle_held(self, reservation: Reservation) -> None:
        """Settle a call cut short at what its reservation holds (flag ``cut_short``)."""
        local = self._local
        if local is not None:
            local.settle_now(reservation, reservation.tokens, reservation.pico)
        else:
            await self._instrument.ledger.settle(reservation, reservation.tokens, reservation.pico)
        self._settled(reservation, reservation.tokens, reservation.pico, ["cut_short"])

    async def _release(self, reservation: Reservation) -> None:
        local = self._local
        if local is not None:
            local.settle_now(reservation, 0, 0, used=False)
        else:
            await self._instrument.ledger.release(reservation)

    def _overrun(self, reservation: Reservation, tokens: int, pico: int) -> None:
        record = self._node.record
        if "overrun" not in record.flags:
            record.flags.append("overrun")
        bus = self._node.run.bus
        if bus.wants("budget_overrun"):
            bus.emit(
                BudgetOverrun(
                    run_id=bus.run_id,
                    path=self._node.path,
                    phase=reservation.phase,
                    tokens_over=max(0, tokens - reservation.tokens),
                    usd_over=self._usd(max(0, pico - reservation.pico)),
                )
            )

    def _settled(self, reservation: Reservation, tokens: int, pico: int, flags: list[str]) -> None:
        bus = self._node.run.bus
        if bus.wants("budget_settled"):
            bus.emit(
                BudgetSettled(
                    run_id=bus.run_id,
                    path=self._node.path,
                    phase=reservation.phase,
                    tokens=tokens,
                    usd=self._usd(pico),
                    reserved_tokens=reservation.tokens,
                    reserved_usd=self._usd(reservation.pico),
                    flags=flags,
                )
            )

    def _usd(self, pico: int) -> float | None:
        return pico_to_usd(pico) if self._instrument.usd_tracked else None

    async def _fit(
        self, account: Account, request: ModelRequest, input_tokens: int
    ) -> tuple[Reservation, ModelRequest]:
        """Lower ``max_tokens`` to what the budget has left, down to the floor, or raise."""
        instrument = self._instrument
        ledger = instrument.ledger
        rate_in, _, rate_out, _, _ = self._rates
        floor = instrument.output_floor(request.max_tokens)
        input_pico = input_tokens * rate_in
        avail_t: int | None = None
        avail_p: int | None = None
        # A shared ledger may hand what looked available to another process between the two
        # calls below; try again a few times before giving up.
        for _ in range(3):
            avail_t, avail_p = await ledger.available(account)
            fits = request.max_tokens
            if avail_t is not None:
                fits = min(fits, avail_t - input_tokens)
            if avail_p is not None:
                rest = avail_p - input_pico
                if rate_out:
                    fits = min(fits, rest // rate_out)
                elif rest < 0:
                    fits = -1
            if fits < floor:
                break
            reservation = await ledger.reserve(
                account, input_tokens + fits, input_pico + fits * rate_out, request.phase
            )
            if reservation is not None:
                self._counts().lowered += 1
                return reservation, request.with_max_tokens(fits)
        need_t = input_tokens + floor
        need_p = input_pico + floor * rate_out
        self._counts().refused += 1
        self._exhausted(request, need_t, need_p, avail_t, avail_p)
        options = self._instrument.instrument.budget_options
        raise BudgetExceeded(
            f"node {self._node.path} is out of budget: its {request.phase} call needs at least "
            f"{self._amount(need_t, need_p)} (max_tokens lowered to {floor:,}) but "
            f"{self._amount(avail_t, avail_p)} remain; the call was not made (give the run a "
            f"larger budget with {options}, or this node a larger share)"
        )

    def _counts(self) -> _Counts:
        state = self._node.state
        key = self._instrument.counts_key
        counts = state.get(key)
        if not isinstance(counts, _Counts):
            counts = state[key] = _Counts()
        return counts

    def _amount(self, tokens: int | None, pico: int | None) -> str:
        parts = []
        if tokens is not None:
            parts.append(f"{tokens:,} tokens")
        if pico is not None and self._instrument.usd_tracked:
            parts.append(f"${pico_to_usd(pico):.6f}")
        return " / ".join(parts) or "no limit"

    def _exhausted(
        self,
        request: ModelRequest,
        need_t: int,
        need_p: int,
        avail_t: int | None,
        avail_p: int | None,
    ) -> None:
        bus = self._node.run.bus
        if bus.wants("budget_exhausted"):
            bus.emit(
                BudgetExhausted(
                    run_id=bus.run_id,
                    path=self._node.path,
                    phase=request.phase,
                    needed_tokens=need_t,
                    needed_usd=self._usd(need_p),
                    available_tokens=avail_t,
                    available_usd=None if avail_p is None else self._usd(avail_p),
                )
            )
