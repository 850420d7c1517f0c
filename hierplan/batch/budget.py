"""One global budget for a batch: the batch is the parent of every goal's budget.

The batch ledger (a :class:`~hierplan.budgets.ledger.LocalLedger`, or a
:class:`~hierplan.budgets.redis_ledger.RedisLedger` shared by Celery workers) holds a root
account with the batch's budget. Before a goal starts, it is **granted** an allocation: an
account of its own, opened under the root with a :class:`~hierplan.budgets.budget.Fixed` grant:

- its **cap** (the goal's ``budget_usd``/``budget_tokens``, else ``--goal-budget-*``, else an
  equal part of the batch budget per concurrent goal), when that fits in what the batch has left;
- when it does not fit and other goals hold grants, the goal **waits**: what they do not spend
  comes back when they end;
- when it does not fit and no other goal holds a grant, the goal gets what is left if that
  covers its **minimum** (one planning call at the lowest ``max_tokens`` the budget allows);
  otherwise it is **skipped**: recorded as not started, for budget reasons.

The goal's run spends within its grant through the normal budget instrument, on a
:class:`GoalLedger`: the run's tree of accounts lives in a local ledger of its own, and every
reservation and settlement of a model call is mirrored on the goal's account of the batch
ledger, atomically there, before the call is made and after it is settled. So the batch ledger
always knows what each goal has spent and holds, whichever process runs it; at the end the goal's
account is closed: its spend stays spent and the rest returns to the batch. A goal whose process
died has its account **written off**: the calls it still held count as spent (they may have been
billed), and the rest returns. The batch never spends more than its budget, at any concurrency,
because no reservation anywhere is made without fitting in its goal's grant, and no grant
without fitting in the batch's root account, each check atomic in its ledger.
"""

from __future__ import annotations

import contextlib
import math
import os
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from types import MappingProxyType
from typing import Literal

from hierplan.agents import planner
from hierplan.agents.prompts import PlanPrompt, render_plan_prompt
from hierplan.batch.goals import BatchGoal
from hierplan.budgets.budget import Account, Balance, Fixed, Grant, LedgerError, Reservation
from hierplan.budgets.instrument import DEFAULT_MIN_OUTPUT_FRACTION, unknown_price_message
from hierplan.budgets.ledger import Ledger, LocalLedger, Outstanding
from hierplan.core.settings import RunSettings
from hierplan.errors import BudgetExceeded, UserInputError
from hierplan.models.base import ModelRequest, Phase, parse_model_string
from hierplan.models.tokens import anthropic_tool_prompt_tokens, estimate_request_tokens
from hierplan.plans.plan import DEFAULT_MAX_STEPS
from hierplan.pricing import PriceTable
from hierplan.runner.models import priced_as_of
from hierplan.units import rate_to_pico, usd_to_pico

Amounts = tuple[int | None, int | None]  # tokens, pico-dollars; None: not limited


@dataclass(slots=True, frozen=True)
class BatchBudget:
    """The batch's budget and the defaults its goals take.

    ``tokens``/``pico``: the batch's limits (``None``: unlimited). ``goal_tokens``/``goal_pico``:
    the cap of a goal that sets none (``None``: an equal part of the batch's budget per
    concurrent goal).
    """

    tokens: int | None
    pico: int | None
    concurrency: int
    goal_tokens: int | None = None
    goal_pico: int | None = None

    def default_cap(self) -> Amounts:
        """The cap of a goal that sets none, per limited dimension."""
        tokens = self.goal_tokens
        pico = self.goal_pico
        if tokens is None and self.tokens is not None:
            tokens = self.tokens // self.concurrency
        if pico is None and self.pico is not None:
            pico = self.pico // self.concurrency
        return tokens, pico


def goal_cap(goal: BatchGoal, budget: BatchBudget) -> Amounts:
    """The goal's cap: its own, else the batch default (only where some limit applies)."""
    default_t, default_p = budget.default_cap()
    spec = goal.spec
    tokens = spec.budget_tokens if spec.budget_tokens is not None else default_t
    pico = usd_to_pico(spec.budget_usd) if spec.budget_usd is not None else default_p
    return tokens, pico


def goal_minimum(
    goal: BatchGoal, default_model: str, pricing: PriceTable, settings: RunSettings
) -> tuple[int, int]:
    """The least a goal must be granted to start: its root's first planning call with
    ``max_tokens`` lowered to the budget's floor, in tokens and pico-dollars.

    The input is estimated from the goal's text and the specs of its tools, which the
    planning prompt lists (a scenario's text and tools are not known before it is set up, so
    only the prompt's own text counts there; a suite task's are), priced as the goal's model. A
    model
    without a price gives 0 pico-dollars (a USD budget refuses it before anything starts).
    """
    floor = max(1, math.ceil(settings.planner_max_tokens * DEFAULT_MIN_OUTPUT_FRACTION))
    prompt = PlanPrompt(
        goal=goal.spec.known_text(),
        depth=1,
        max_depth=goal.spec.max_depth or settings.max_depth,
        max_steps=DEFAULT_MAX_STEPS,
    )
    request = ModelRequest(
        messages=render_plan_prompt(prompt, goal.spec.known_tools()),
        output_schema=planner.PLAN_OUTPUT,
        max_tokens=floor,
        phase="planning",
    )
    model = goal.spec.model or default_model
    input_tokens = estimate_request_tokens(request) + _hidden_planning_tokens(model)
    price = pricing.lookup(priced_as_of(model))
    if price is None:
        return input_tokens + floor, 0
    pico = input_tokens * rate_to_pico(price.input_per_mtok) + floor * rate_to_pico(
        price.output_per_mtok
    )
    return input_tokens + floor, pico


def _hidden_planning_tokens(model: str) -> int:
    """The least input a provider adds on its own to a planning call on ``model``: Anthropic's
    tool-use system prompt, since a plan comes back through a tool (the smaller of its two
    sizes, as whether the tool is forced depends on the model's options: the minimum stays a
    minimum)."""
    parsed = parse_model_string(model)
    if parsed.provider != "anthropic":
        return 0
    return min(anthropic_tool_prompt_tokens(parsed.name, forced=f) for f in (False, True))


def check_prices(
    goals: tuple[BatchGoal, ...], default_model: str, pricing: PriceTable, usd: bool
) -> None:
    """Under a USD budget every goal's model needs a price (a budget fails closed)."""
    if not usd:
        return
    for goal in goals:
        model = goal.spec.model or default_model
        parse_model_string(model)
        priced = priced_as_of(model)
        if pricing.lookup(priced) is None:
            raise UserInputError(f"line {goal.line}: {unknown_price_message(priced)}")


# The variable each provider's API key is read from.
_KEY_VARIABLES = MappingProxyType({"openai": "OPENAI_API_KEY", "anthropic": "ANTHROPIC_API_KEY"})


def check_keys(goals: tuple[BatchGoal, ...], default_model: str) -> None:
    """Every provider model the goals name has its API key in the environment, checked
    before anything starts (as a run checks it), with the lines that need each key."""
    missing: dict[str, list[int]] = {}
    for goal in goals:
        provider = parse_model_string(goal.spec.model or default_model).provider
        variable = _KEY_VARIABLES.get(provider)
        if variable is not None and not os.environ.get(variable, "").strip():
            missing.setdefault(variable, []).append(goal.line)
    if missing:
        needs = "; ".join(
            f"set {var} (needed by line{'s' if len(lines) > 1 else ''} "
            f"{', '.join(map(str, lines[:10]))}{' ...' if len(lines) > 10 else ''})"
            for var, lines in missing.items()
        )
        raise UserInputError(f"goals use provider models without an API key: {needs}")


Decision = Literal["grant", "wait", "skip"]


def decide(
    available: Amounts,
    cap: Amounts,
    minimum: tuple[int, int],
    others_running: bool,
) -> tuple[Decision, Amounts]:
    """Whether a goal starts now, waits, or is skipped, and with what grant.

    In each dimension where the batch is limited (``available`` is not ``None``): the cap if
    it fits; else wait while other goals hold grants; else what is left, if it covers the
    minimum. Where the batch is unlimited the grant is ``None`` (the goal's own cap, if any,
    still applies inside its run).
    """
    fits_cap = all(a is None or c is None or a >= c for a, c in zip(available, cap, strict=True))
    if fits_cap:
        grant = tuple(
            None if a is None else (a if c is None else c)
            for a, c in zip(available, cap, strict=True)
        )
        return "grant", (grant[0], grant[1])
    if others_running:
        return "wait", (None, None)
    if all(a is None or a >= m for a, m in zip(available, minimum, strict=True)):
        grant = tuple(
            None if a is None else (a if c is None else min(a, c))
            for a, c in zip(available, cap, strict=True)
        )
        return "grant", (grant[0], grant[1])
    return "skip", (None, None)


async def grant_goal(
    ledger: Ledger,
    root: Account,
    name: str,
    cap: Amounts,
    minimum: tuple[int, int],
    *,
    attempts: int = 20,
    opener: Opener | None = None,
) -> tuple[Decision, Account | None, Amounts]:
    """Decide (see :func:`decide`) and open the goal's account under ``root`` (with
    ``opener``, which takes the name, parent and grant, if given; else ``ledger.open``).

    On a ledger shared by many processes another grant may take what looked available between
    the look and the open; the open then fails atomically and the decision is made again.
    """
    opener = opener or ledger.open
    for _ in range(attempts):
        available = await ledger.available(root)
        balance = await ledger.balance(root)
        others = bool(balance.granted_tokens or balance.granted_pico)
        decision, amounts = decide(available, cap, minimum, others)
        if decision != "grant":
            return decision, None, (None, None)
        try:
            account = await opener(name, root, Fixed(*amounts))
        except BudgetExceeded:
            continue
        return "grant", account, amounts
    return "wait", None, (None, None)


Opener = Callable[[str, Account, Fixed], Awaitable[Account]]
"""How :func:`grant_goal` opens a goal's account: from its name, parent and grant."""


class GoalLedger(Ledger):
    """The ledger of one goal's run: a local ledger for the run's tree of accounts, with every
    model call's reservation mirrored on the goal's account of the batch ledger.

    ``on_change`` is called (synchronously) after each mirrored reservation, settlement and
    release, with what the goal's account holds and has spent: the local backend journals it
    there, before the call is made. If the batch ledger refuses a reservation (the goal's
    account was written off because this attempt was presumed dead), the call is refused.
    """

    def __init__(
        self,
        outer: Ledger,
        account: Account,
        on_change: Callable[[tuple[int, int], tuple[int, int]], None] | None = None,
    ) -> None:
        self.inner = LocalLedger()
        self.outer = outer
        self.account = account
        self.on_change = on_change
        self._mirrors: dict[Reservation, Reservation] = {}

    async def open(self, name: str, parent: Account | None, grant: Grant) -> Account:
        """See :meth:`Ledger.open` (the run's own accounts are local)."""
        return self.inner.open_now(name, parent, grant)

    async def reserve(
        self, account: Account, tokens: int, pico: int, phase: Phase
    ) -> Reservation | None:
        """Reserve in the run's tree, then on the goal's account of the batch ledger."""
        local = self.inner.reserve_now(account, tokens, pico, phase)
        if local is None:
            return None
        try:
            mirror = await self.outer.reserve(self.account, tokens, pico, phase)
        except LedgerError:
            mirror = None  # the goal's account was closed under this attempt
        except BaseException:
            self.inner.settle_now(local, 0, 0, used=False)
            raise
        if mirror is None:
            self.inner.settle_now(local, 0, 0, used=False)
            return None
        self._mirrors[local] = mirror
        await self._changed()
        return local

    async def settle(self, reservation: Reservation, tokens: int, pico: int) -> None:
        """Settle in the run's tree and on the batch ledger."""
        self.inner.settle_now(reservation, tokens, pico)
        mirror = self._mirrors.pop(reservation, None)
        if mirror is not None:
            # Written off meanwhile: the whole reservation already counts as spent.
            with contextlib.suppress(LedgerError):
                await self.outer.settle(mirror, tokens, pico)
        await self._changed()

    async def release(self, reservation: Reservation) -> None:
        """Release in the run's tree and on the batch ledger."""
        self.inner.settle_now(reservation, 0, 0, used=False)
        mirror = self._mirrors.pop(reservation, None)
        if mirror is not None:
            with contextlib.suppress(LedgerError):
                await self.outer.release(mirror)
        await self._changed()

    async def top_up(self, account: Account, tokens: int, pico: int) -> bool:
        """See :meth:`Ledger.top_up` (within the run's own tree: the goal's grant is fixed)."""
        return self.inner.top_up_now(account, tokens, pico)

    async def close(self, account: Account) -> Balance:
        """See :meth:`Ledger.close`."""
        return self.inner.close_now(account)

    async def available(self, account: Account) -> tuple[int | None, int | None]:
        """See :meth:`Ledger.available`."""
        return self.inner.available_now(account)

    async def balance(self, account: Account) -> Balance:
        """See :meth:`Ledger.balance`."""
        return self.inner.balance_now(account)

    async def outstanding(self) -> Outstanding:
        """See :meth:`Ledger.outstanding`."""
        return await self.inner.outstanding()

    async def _changed(self) -> None:
        if self.on_change is None:
            return
        b = await self.outer.balance(self.account)
        self.on_change((b.reserved_tokens, b.reserved_pico), (b.spent_tokens, b.spent_pico))
