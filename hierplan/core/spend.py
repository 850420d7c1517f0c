"""What a node may still spend, and what a call costs at least: the figures a planner is told
and a plan's budget check reads.

A budget instrument reports a node's :class:`Funds` (what its account could reserve now, the
prices of the run's models, how far a call's ``max_tokens`` may be lowered); the orchestration
adds how the budget counts a request's input, making a :class:`Spending`. The least a call can
cost is what a budget must be able to reserve to make it at all: its input, counted as the
budget counts it, and ``max_tokens`` lowered to the floor.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import NamedTuple

from hierplan.models.base import ModelRequest
from hierplan.units import PICO_PER_USD


class Cost(NamedTuple):
    """An amount in tokens and pico-dollars (10^-12 USD)."""

    tokens: int
    pico: int

    def plus(self, other: Cost) -> Cost:
        """The sum of two amounts."""
        return Cost(self.tokens + other.tokens, self.pico + other.pico)


NOTHING = Cost(0, 0)


@dataclass(slots=True, frozen=True)
class Funds:
    """A node's budget now, as its budget instrument reports it.

    ``tokens``/``pico``: what the node's account could reserve now (``None``: no limit in that
    dimension). ``usd_tracked``: whether every model of the run has a price (else USD figures
    are unknown). ``planner_rates``/``executor_rates``: pico-dollars per input and per output
    token of the planners' and executors' model. ``min_output_fraction``: how far a call's
    ``max_tokens`` may be lowered to fit.
    """

    tokens: int | None
    pico: int | None
    usd_tracked: bool
    planner_rates: tuple[int, int]
    executor_rates: tuple[int, int]
    min_output_fraction: float

    def output_floor(self, max_tokens: int) -> int:
        """The least ``max_tokens`` a call asking for ``max_tokens`` may be lowered to."""
        return max(1, min(max_tokens, math.ceil(max_tokens * self.min_output_fraction)))


InputCount = Callable[[ModelRequest], int]


@dataclass(slots=True, frozen=True)
class Spending:
    """A node's :class:`Funds`, and how its budget counts the input of a planning and of an
    executor request: what the least cost of a call is computed from."""

    funds: Funds
    count_planning: InputCount
    count_execution: InputCount

    @property
    def left(self) -> tuple[int | None, int | None]:
        """Tokens and pico-dollars the node could spend now (``None``: no limit)."""
        return self.funds.tokens, self.funds.pico

    def least_call(self, request: ModelRequest) -> Cost:
        """The least ``request`` can cost: its input, and ``max_tokens`` at the floor."""
        funds = self.funds
        planning = request.phase == "planning"
        count = self.count_planning if planning else self.count_execution
        rate_in, rate_out = funds.planner_rates if planning else funds.executor_rates
        input_tokens = count(request)
        output = funds.output_floor(request.max_tokens)
        return Cost(input_tokens + output, input_tokens * rate_in + output * rate_out)

    def shortfall(self, cost: Cost) -> Cost | None:
        """By how much ``cost`` is more than what is left, in each limited dimension (0 where it
        fits), or ``None`` when it fits."""
        tokens, pico = self.left
        over_t = 0 if tokens is None else max(0, cost.tokens - tokens)
        over_p = 0 if pico is None or not self.funds.usd_tracked else max(0, cost.pico - pico)
        return Cost(over_t, over_p) if over_t or over_p else None

    def text(self, cost: Cost) -> str:
        """An amount in the dimensions this budget limits: ``$0.000400 / 1,500 tokens``."""
        return amount_text(
            cost,
            tokens=self.funds.tokens is not None,
            usd=self.funds.pico is not None and self.funds.usd_tracked,
        )

    def left_text(self) -> str:
        """What is left, as :meth:`text` shows an amount."""
        tokens, pico = self.left
        return self.text(Cost(tokens or 0, pico or 0))


def amount_text(cost: Cost, *, tokens: bool, usd: bool) -> str:
    """``cost`` in the dimensions asked for: ``$0.000400 / 1,500 tokens`` (``nothing`` for
    neither)."""
    parts = []
    if usd:
        parts.append(f"${cost.pico / PICO_PER_USD:.6f}")
    if tokens:
        parts.append(f"{cost.tokens:,} tokens")
    return " / ".join(parts) or "nothing"
