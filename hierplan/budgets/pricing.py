"""A versioned price table: USD per million input, output and cached-input tokens.

Every entry names its source and the date it was read. A model missing from the table has no
price: :meth:`PriceTable.cost` returns ``None`` and never counts the call as free; a USD budget
on an unpriced model fails closed (see :mod:`hierplan.budgets`).

The simulator is priced "as if" it were a named real model, so simulated runs report what the
same token counts would have cost there.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from hierplan.agents.models.base import Usage

PRICE_TABLE_VERSION = "2025-11-01"

_OPENAI_SOURCE = "https://openai.com/api/pricing/"
_ANTHROPIC_SOURCE = "https://docs.anthropic.com/en/docs/about-claude/pricing"


@dataclass(slots=True, frozen=True)
class Price:
    """USD per one million tokens, with where and when the figure was read."""

    input_per_mtok: float
    output_per_mtok: float
    cached_input_per_mtok: float | None = None
    source: str = ""
    as_of: str = ""

    def cost(self, usage: Usage) -> float:
        """The USD cost of ``usage`` at this price.

        Cached input tokens are a subset of input tokens; they are charged at the cached rate
        when one is known, otherwise at the full input rate.
        """
        cached_rate = (
            self.cached_input_per_mtok
            if self.cached_input_per_mtok is not None
            else self.input_per_mtok
        )
        fresh = usage.input_tokens - usage.cached_input_tokens
        return (
            fresh * self.input_per_mtok
            + usage.cached_input_tokens * cached_rate
            + usage.output_tokens * self.output_per_mtok
        ) / 1_000_000


def _openai(inp: float, out: float, cached: float, as_of: str = "2025-08-07") -> Price:
    return Price(inp, out, cached, _OPENAI_SOURCE, as_of)


def _anthropic(inp: float, out: float, cached: float, as_of: str = "2025-11-24") -> Price:
    return Price(inp, out, cached, _ANTHROPIC_SOURCE, as_of)


DEFAULT_PRICES: Mapping[str, Price] = {
    "openai:gpt-5": _openai(1.25, 10.00, 0.125),
    "openai:gpt-5-mini": _openai(0.25, 2.00, 0.025),
    "openai:gpt-5-nano": _openai(0.05, 0.40, 0.005),
    "openai:gpt-4.1": _openai(2.00, 8.00, 0.50, "2025-04-14"),
    "openai:gpt-4.1-mini": _openai(0.40, 1.60, 0.10, "2025-04-14"),
    "openai:gpt-4.1-nano": _openai(0.10, 0.40, 0.025, "2025-04-14"),
    "openai:gpt-4o": _openai(2.50, 10.00, 1.25, "2024-10-01"),
    "openai:gpt-4o-mini": _openai(0.15, 0.60, 0.075, "2024-07-18"),
    "openai:o3": _openai(2.00, 8.00, 0.50, "2025-06-10"),
    "openai:o4-mini": _openai(1.10, 4.40, 0.275, "2025-04-16"),
    "anthropic:claude-opus-4-5": _anthropic(5.00, 25.00, 0.50),
    "anthropic:claude-opus-4-1": _anthropic(15.00, 75.00, 1.50, "2025-08-05"),
    "anthropic:claude-sonnet-4-5": _anthropic(3.00, 15.00, 0.30, "2025-09-29"),
    "anthropic:claude-sonnet-4": _anthropic(3.00, 15.00, 0.30, "2025-05-22"),
    "anthropic:claude-haiku-4-5": _anthropic(1.00, 5.00, 0.10, "2025-10-15"),
    "anthropic:claude-3-5-haiku": _anthropic(0.80, 4.00, 0.08, "2024-11-04"),
}

DEFAULT_SIMULATED_PRICED_AS = "openai:gpt-5-mini"


class PriceTable:
    """Look up prices by model string; dated snapshots fall back to their base model.

    ``openai:gpt-4.1-mini-2025-04-14`` finds ``openai:gpt-4.1-mini``. Overrides (from
    ``--price-in/--price-out`` or the library) take precedence over the table.
    """

    def __init__(
        self,
        prices: Mapping[str, Price] | None = None,
        *,
        version: str = PRICE_TABLE_VERSION,
    ) -> None:
        self.version = version
        self._prices: dict[str, Price] = dict(DEFAULT_PRICES if prices is None else prices)
        self._cache: dict[str, Price | None] = {}

    def with_override(self, model: str, price: Price) -> PriceTable:
        """A copy of the table in which ``model`` has ``price``."""
        table = PriceTable(self._prices, version=f"{self.version}+override")
        table._prices[model] = price
        return table

    def lookup(self, model: str) -> Price | None:
        """The price of ``model`` (``provider:name``), or ``None`` when unknown."""
        try:
            return self._cache[model]
        except KeyError:
            pass
        found = self._prices.get(model)
        if found is None:
            # Dated snapshots ("gpt-4.1-mini-2025-04-14", "claude-sonnet-4-5-20250929") share
            # the base model's price: take the longest table key that prefixes the name.
            candidates = [key for key in self._prices if model.startswith(key + "-")]
            if candidates:
                found = self._prices[max(candidates, key=len)]
        self._cache[model] = found
        return found

    def cost(self, model: str, usage: Usage) -> float | None:
        """USD cost of ``usage`` on ``model``, or ``None`` when the price is unknown."""
        price = self.lookup(model)
        return None if price is None else price.cost(usage)

    def models(self) -> list[str]:
        """Every model string in the table."""
        return sorted(self._prices)
