"""Budgets and the ledger that enforces them: exact under any concurrency.

A :class:`Budget` caps tokens, USD, or both (``None`` means unlimited). The :class:`Ledger` holds
one account per node of the run tree. The root's account holds the run's budget; a child's
account is funded from its parent by a :class:`Grant`:

- :class:`Share`: a fraction of what the parent has available is carved out for the child when it
  starts (the ``equal`` and ``weighted`` allocation policies); what the child did not spend goes
  back to the parent when it closes.
- :class:`Draw`: the child takes nothing up front; each of its reservations is taken from the
  parent's pool as well, and the child is capped at a fraction of what the parent had available
  when it started (the ``on-demand`` policy).
- :class:`Fixed`: an explicit amount (the root, or a goal under a batch's global budget).

Every model call reserves its worst case before it is made and settles the actual usage after:

    reserve(account, tokens, pico)  ->  Reservation | None      (None: it does not fit)
    settle(reservation, tokens, pico)                           (the rest is released)
    release(reservation)                                        (nothing was used)

Amounts are integers: tokens, and USD in pico-dollars (10^-12 USD), so that sums are exact and
"spent <= budget" never depends on float rounding. At every account, at every moment::

    allocated == spent + released + reserved + granted (+ what a carved account still has free)

and once an account is closed nothing is reserved, granted or free: ``allocated == spent +
released``. ``spent`` is the account's whole subtree; the part its own calls spent is kept per
phase (planning, execution).

:class:`Ledger` is the contract; :class:`LocalLedger` implements it for one event loop. A ledger
shared by many processes implements the same methods (each of them atomic).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

from hierplan.core.spend import Cost
from hierplan.core.views import StepWork
from hierplan.errors import HierplanError, UserInputError
from hierplan.models.base import Phase
from hierplan.units import usd_to_pico

AllocationName = Literal["need", "equal", "weighted", "on-demand"]
ALLOCATIONS: tuple[str, ...] = ("need", "equal", "weighted", "on-demand")
DEFAULT_ALLOCATION = "need"
DEFAULT_ON_DEMAND_FRACTION = 0.5


MAX_BUDGET_USD = 1e9
"""The largest USD budget: larger ones are surely typing mistakes, and their pico-dollars
would not fit the floats that shares are computed in."""
MAX_BUDGET_TOKENS = 10**15
"""The largest token budget (as a goals file's ``budget_tokens``)."""


class LedgerError(HierplanError):
    """The ledger was used against its contract (a bug in the caller, not a budget problem)."""


@dataclass(slots=True, frozen=True)
class Budget:
    """A cap on tokens and/or USD; ``None`` leaves that dimension unlimited.

    >>> Budget(usd=0.05).limited
    True
    >>> Budget().limited
    False
    """

    tokens: int | None = None
    usd: float | None = None

    def __post_init__(self) -> None:
        if self.tokens is not None and (
            isinstance(self.tokens, bool)
            or not isinstance(self.tokens, int)
            or not 0 <= self.tokens <= MAX_BUDGET_TOKENS
        ):
            raise UserInputError(
                f"a token budget must be a whole number from 0 to {MAX_BUDGET_TOKENS:,}, "
                f"not {self.tokens!r}"
            )
        if self.usd is not None and (
            isinstance(self.usd, bool)
            or not isinstance(self.usd, int | float)
            or not math.isfinite(self.usd)
            or not 0 <= self.usd <= MAX_BUDGET_USD
        ):
            raise UserInputError(
                f"a USD budget must be a finite number from 0 to {MAX_BUDGET_USD:,.0f}, "
                f"not {self.usd!r}"
            )

    @property
    def limited(self) -> bool:
        """Whether any dimension has a limit."""
        return self.tokens is not None or self.usd is not None

    @property
    def pico(self) -> int | None:
        """The USD limit in pico-dollars, or ``None``."""
        return None if self.usd is None else usd_to_pico(self.usd)

    def __str__(self) -> str:
        parts = []
        if self.tokens is not None:
            parts.append(f"{self.tokens:,} tokens")
        if self.usd is not None:
            parts.append(f"${self.usd:g}")
        return " and ".join(parts) or "unlimited"


# -- grants: how a child account is funded -------------------------------------------------


@dataclass(slots=True, frozen=True)
class Fixed:
    """An explicit allocation (``None``: unlimited in that dimension, only where the parent is)."""

    tokens: int | None
    pico: int | None


@dataclass(slots=True, frozen=True)
class Share:
    """Carve these fractions of the parent's available tokens and USD when the child opens."""

    tokens_fraction: float
    usd_fraction: float


@dataclass(slots=True, frozen=True)
class Draw:
    """Take from the parent's pool per reservation, capped at ``fraction`` of what the parent
    has available when the child opens."""

    fraction: float


Grant = Fixed | Share | Draw


class Account:
    """A ledger account: one node's budget. Implementations add their own state."""

    __slots__ = ("name", "parent")

    def __init__(self, name: str, parent: Account | None) -> None:
        self.name = name
        self.parent = parent


class Reservation:
    """An amount held for one model call until it is settled or released."""

    __slots__ = ("account", "open", "phase", "pico", "tokens")

    def __init__(self, account: Account, tokens: int, pico: int, phase: Phase) -> None:
        self.account = account
        self.tokens = tokens
        self.pico = pico
        self.phase = phase
        self.open = True


@dataclass(slots=True)
class Balance:
    """An account's figures. Limits and allocations are ``None`` in an unlimited dimension.

    ``limit``: what the account may spend (its allocation, or its cap when it draws).
    ``allocated``: what it took from its parent. ``spent``: its subtree's settled usage.
    ``released``: what went back to the parent unused. ``reserved``/``granted``: held now for
    calls in flight / for open children. ``peak_reserved``: the most held for calls at once.
    ``overrun``: usage above what was reserved (flagged, never hidden). ``own``: what the
    account's own calls spent, per phase. ``denied``: reservations that did not fit.
    """

    name: str
    grant: str
    limit_tokens: int | None
    limit_pico: int | None
    allocated_tokens: int | None
    allocated_pico: int | None
    spent_tokens: int
    spent_pico: int
    released_tokens: int | None
    released_pico: int | None
    reserved_tokens: int
    reserved_pico: int
    granted_tokens: int
    granted_pico: int
    peak_reserved_tokens: int
    peak_reserved_pico: int
    overrun_tokens: int
    overrun_pico: int
    own: dict[str, tuple[int, int]]
    denied: int
    closed: bool

    @property
    def balanced(self) -> bool:
        """``allocated == spent + released`` in every limited dimension, nothing held."""
        if self.reserved_tokens or self.reserved_pico or self.granted_tokens or self.granted_pico:
            return False
        for allocated, spent, released in (
            (self.allocated_tokens, self.spent_tokens, self.released_tokens),
            (self.allocated_pico, self.spent_pico, self.released_pico),
        ):
            if allocated is not None and allocated + self._overspent(allocated, spent) != (
                spent + (released or 0)
            ):
                return False
        return True

    @staticmethod
    def _overspent(allocated: int, spent: int) -> int:
        return max(0, spent - allocated)


# -- allocation policies -------------------------------------------------------------------


def step_weights(
    steps: Mapping[str, StepWork],
    allocation: str,
    least: Mapping[str, Cost] | None = None,
    *,
    usd: bool = False,
) -> dict[str, float]:
    """The weight of each model-using step (by id) under an allocation policy.

    ``equal``: every step weighs 1. ``weighted``: the planner's estimates, in tokens if the plan
    gives any token estimate, else in USD; a step without one (or with 0) weighs the mean of
    the others; with no estimates at all, every step weighs 1. ``need``: what the step needs,
    in pico-dollars when the budget limits ``usd``, else in tokens: the plan's estimate, but
    never less than the least the step costs (``least``, from the plan's budget check: a
    sub-goal's first planning call, a task's first executor call), so that a small step is not
    starved by large ones. (``on-demand`` does not carve.)
    """
    if allocation == "need":
        return _need_weights(steps, least or {}, usd)
    if allocation != "weighted":
        return dict.fromkeys(steps, 1.0)
    tokens = {k: float(w.estimate_tokens) for k, w in steps.items() if w.estimate_tokens}
    given: Mapping[str, float] = tokens or {
        k: float(w.estimate_usd) for k, w in steps.items() if w.estimate_usd
    }
    if not given:
        return dict.fromkeys(steps, 1.0)
    mean = sum(given.values()) / len(given)
    return {k: given.get(k, mean) for k in steps}


def _need_weights(
    steps: Mapping[str, StepWork], least: Mapping[str, Cost], usd: bool
) -> dict[str, float]:
    """``need``'s weights (see :func:`step_weights`). A token estimate is priced, for a USD
    budget, at the step's own least cost per token; a step with neither an estimate nor a
    least cost weighs the mean of the others (1 when none has either)."""
    weights: dict[str, float] = {}
    for key, work in steps.items():
        floor = least.get(key)
        estimate: float = 0.0
        if usd:
            if work.estimate_usd:
                estimate = usd_to_pico(work.estimate_usd)
            elif work.estimate_tokens and floor is not None and floor.tokens:
                estimate = work.estimate_tokens * floor.pico / floor.tokens
        elif work.estimate_tokens:
            estimate = float(work.estimate_tokens)
        need = max(estimate, 0.0 if floor is None else float(floor.pico if usd else floor.tokens))
        if need > 0:
            weights[key] = need
    mean = sum(weights.values()) / len(weights) if weights else 1.0
    return {k: weights.get(k, mean) for k in steps}
