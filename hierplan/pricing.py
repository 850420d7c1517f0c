"""A versioned price table: USD per million input, output, cached-input and cache-write tokens.

Every entry names its source and the date it was read. A model missing from the table has no
price: :meth:`PriceTable.cost` returns ``None`` and never counts the call as free; a USD budget
on an unpriced model fails closed (see :mod:`hierplan.budgets`).

The simulator is priced "as if" it were a named real model, so simulated runs report what the
same token counts would have cost there.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, replace
from types import MappingProxyType

from hierplan.units import Usage, rate_to_pico

PRICE_TABLE_VERSION = "2026-12-03"

# The providers' own pages are the canonical sources. Where a figure was checked against a
# second, dated page (the providers' pages cannot be fetched from every machine), that page is
# named too. Standard tier, short context; "cached" is a prompt-cache read, and Anthropic's
# cache writes are priced from the input rate (see ANTHROPIC_CACHE_WRITE_5M_MULTIPLIER).
_OPENAI_SOURCE = "https://openai.com/api/pricing/"
_ANTHROPIC_SOURCE = "https://platform.claude.com/docs/en/about-claude/pricing"


def _checked(canonical: str, page: str) -> str:
    return f"{canonical} (checked against {page})"


_OPENAI_2026 = _checked(
    _OPENAI_SOURCE, "https://tokenmix.ai/blog/openai-api-cost-2026-gpt-5-5-5-4-nano-batch"
)
_OPENAI_PRO = _checked(_OPENAI_SOURCE, "https://www.morphllm.com/openai-api-pricing")
_OPENAI_52 = _checked(
    _OPENAI_SOURCE, "https://nicolalazzari.ai/articles/openai-api-pricing-explained-2026"
)
_OPENAI_51 = _checked(_OPENAI_SOURCE, "https://nativeai.agency/hub/tools/openai-api/model-families")
_CLAUDE_48 = _checked(
    _ANTHROPIC_SOURCE,
    "https://dev.to/hiyoyok/claude-api-cheatsheet-2026-models-pricing-limits-in-one-place-4jf2",
)
_CLAUDE_46 = _checked(_ANTHROPIC_SOURCE, "https://deploybase.ai/articles/claude-api-pricing")
_CLAUDE_5 = _checked(
    _ANTHROPIC_SOURCE,
    "https://dev.to/tokenmixai/claude-fable-5-for-developers-api-changes-pricing-migration-notes-2f0n",
)
_SONNET_5 = _checked(
    _ANTHROPIC_SOURCE, "https://kissapi.ai/blog/claude-sonnet-5-api-migration-guide-2026.html"
)


# Anthropic bills a prompt-cache write above plain input: 1.25 times the base input price for the
# default five-minute cache, 2 times for the one-hour cache (a read is 0.1 times, the cached rates
# below). Source: https://platform.claude.com/docs/en/about-claude/pricing (the prompt caching
# multipliers under the model pricing table; also
# https://platform.claude.com/docs/en/build-with-claude/prompt-caching), read 2026-12-03.
ANTHROPIC_CACHE_WRITE_5M_MULTIPLIER = 1.25
ANTHROPIC_CACHE_WRITE_1H_MULTIPLIER = 2.0


@dataclass(slots=True, frozen=True)
class Price:
    """USD per one million tokens, with where and when the figure was read.

    ``cached_input_per_mtok`` is the price of a prompt-cache read; ``cache_write_per_mtok`` and
    ``cache_write_1h_per_mtok`` the prices of a prompt-cache write kept five minutes and one
    hour (Anthropic's; OpenAI bills cache writes as plain input). A rate left ``None`` is the
    input rate.
    """

    input_per_mtok: float
    output_per_mtok: float
    cached_input_per_mtok: float | None = None
    source: str = ""
    as_of: str = ""
    cache_write_per_mtok: float | None = None
    cache_write_1h_per_mtok: float | None = None

    def cost(self, usage: Usage) -> float:
        """The USD cost of ``usage`` at this price.

        Cache reads and cache writes are subsets of input tokens; each is charged at its own
        rate when one is known, otherwise at the full input rate.
        """
        inp = self.input_per_mtok
        cached = usage.cached_input_tokens
        written = usage.cache_write_tokens
        hour = usage.cache_write_1h_tokens
        fresh = usage.input_tokens - cached - written
        return (
            fresh * inp
            + cached * _or(self.cached_input_per_mtok, inp)
            + (written - hour) * _or(self.cache_write_per_mtok, inp)
            + hour * _or(self.cache_write_1h_per_mtok, inp)
            + usage.output_tokens * self.output_per_mtok
        ) / 1_000_000

    def pico_rates(self) -> PicoRates:
        """The price in whole pico-dollars per token (each rate rounded up, so that a cost
        never shrinks by rounding)."""
        inp = self.input_per_mtok
        return PicoRates(
            rate_to_pico(inp),
            rate_to_pico(_or(self.cached_input_per_mtok, inp)),
            rate_to_pico(self.output_per_mtok),
            rate_to_pico(_or(self.cache_write_per_mtok, inp)),
            rate_to_pico(_or(self.cache_write_1h_per_mtok, inp)),
        )


@dataclass(slots=True, frozen=True)
class PicoRates:
    """Pico-dollars per input, cached input (a cache read) and output token, and per token of a
    five-minute and of a one-hour cache write: the exact unit every cost and budget counts in."""

    input: int
    cached_input: int
    output: int
    cache_write: int
    cache_write_1h: int

    def cost(self, usage: Usage) -> int:
        """The cost of ``usage`` in pico-dollars. Cache reads and writes are subsets of input
        tokens, each charged at its own rate."""
        cached = usage.cached_input_tokens
        written = usage.cache_write_tokens
        hour = usage.cache_write_1h_tokens
        return (
            (usage.input_tokens - cached - written) * self.input
            + cached * self.cached_input
            + (written - hour) * self.cache_write
            + hour * self.cache_write_1h
            + usage.output_tokens * self.output
        )

    def worst_case(self, input_tokens: int, output_tokens: int) -> int:
        """The cost of ``input_tokens`` of fresh input and ``output_tokens`` of output."""
        return input_tokens * self.input + output_tokens * self.output


def _or(rate: float | None, default: float) -> float:
    return default if rate is None else rate


def _openai(
    inp: float, out: float, cached: float | None, as_of: str, source: str = _OPENAI_SOURCE
) -> Price:
    return Price(inp, out, cached, source, as_of)


def with_anthropic_cache_writes(price: Price) -> Price:
    """``price`` with Anthropic's cache-write rates, derived from its input rate."""
    return replace(
        price,
        cache_write_per_mtok=price.input_per_mtok * ANTHROPIC_CACHE_WRITE_5M_MULTIPLIER,
        cache_write_1h_per_mtok=price.input_per_mtok * ANTHROPIC_CACHE_WRITE_1H_MULTIPLIER,
    )


def _anthropic(
    inp: float, out: float, cached: float, as_of: str, source: str = _ANTHROPIC_SOURCE
) -> Price:
    return with_anthropic_cache_writes(Price(inp, out, cached, source, as_of))


DEFAULT_PRICES: Mapping[str, Price] = {
    "openai:gpt-5.5": _openai(5.00, 30.00, 0.50, "2026-06-04", _OPENAI_2026),
    "openai:gpt-5.5-pro": _openai(30.00, 180.00, None, "2026-06-01", _OPENAI_PRO),
    "openai:gpt-5.4": _openai(2.50, 15.00, 0.25, "2026-06-04", _OPENAI_2026),
    "openai:gpt-5.4-mini": _openai(0.75, 4.50, 0.075, "2026-06-04", _OPENAI_2026),
    "openai:gpt-5.4-nano": _openai(0.20, 1.25, 0.02, "2026-06-04", _OPENAI_2026),
    "openai:gpt-5.4-pro": _openai(30.00, 180.00, None, "2026-06-01", _OPENAI_PRO),
    "openai:gpt-5.2": _openai(1.75, 14.00, 0.175, "2026-03-01", _OPENAI_52),
    "openai:gpt-5.2-pro": _openai(21.00, 168.00, None, "2026-03-01", _OPENAI_52),
    "openai:gpt-5.1": _openai(1.25, 10.00, 0.125, "2026-03-01", _OPENAI_51),
    "openai:gpt-5": _openai(1.25, 10.00, 0.125, "2025-08-07"),
    "openai:gpt-5-mini": _openai(0.25, 2.00, 0.025, "2025-08-07"),
    "openai:gpt-5-nano": _openai(0.05, 0.40, 0.005, "2025-08-07"),
    "openai:gpt-4.1": _openai(2.00, 8.00, 0.50, "2025-04-14"),
    "openai:gpt-4.1-mini": _openai(0.40, 1.60, 0.10, "2025-04-14"),
    "openai:gpt-4.1-nano": _openai(0.10, 0.40, 0.025, "2025-04-14"),
    "openai:gpt-4o": _openai(2.50, 10.00, 1.25, "2024-10-01"),
    # A snapshot dearer than its base model: listed on its own, so that the date fallback does
    # not price it as gpt-4o (half what it costs).
    "openai:gpt-4o-2024-05-13": _openai(5.00, 15.00, None, "2024-05-13"),
    "openai:gpt-4o-mini": _openai(0.15, 0.60, 0.075, "2024-07-18"),
    "openai:o3": _openai(2.00, 8.00, 0.50, "2025-06-10"),
    "openai:o4-mini": _openai(1.10, 4.40, 0.275, "2025-04-16"),
    "anthropic:claude-fable-5": _anthropic(10.00, 50.00, 1.00, "2026-06-10", _CLAUDE_5),
    "anthropic:claude-mythos-5": _anthropic(10.00, 50.00, 1.00, "2026-06-10", _CLAUDE_5),
    "anthropic:claude-sonnet-5": _anthropic(3.00, 15.00, 0.30, "2026-09-01", _SONNET_5),
    "anthropic:claude-opus-4-8": _anthropic(5.00, 25.00, 0.50, "2026-05-29", _CLAUDE_48),
    "anthropic:claude-opus-4-6": _anthropic(5.00, 25.00, 0.50, "2026-03-21", _CLAUDE_46),
    "anthropic:claude-sonnet-4-6": _anthropic(3.00, 15.00, 0.30, "2026-05-29", _CLAUDE_48),
    "anthropic:claude-opus-4-5": _anthropic(5.00, 25.00, 0.50, "2025-11-24"),
    "anthropic:claude-opus-4-1": _anthropic(15.00, 75.00, 1.50, "2025-08-05"),
    "anthropic:claude-sonnet-4-5": _anthropic(3.00, 15.00, 0.30, "2025-09-29"),
    "anthropic:claude-sonnet-4": _anthropic(3.00, 15.00, 0.30, "2025-05-22"),
    "anthropic:claude-haiku-4-5": _anthropic(1.00, 5.00, 0.10, "2025-10-15"),
    "anthropic:claude-3-5-haiku": _anthropic(0.80, 4.00, 0.08, "2024-11-04"),
}
DEFAULT_PRICES = MappingProxyType(DEFAULT_PRICES)  # read-only: shared by every run


_SNAPSHOT = re.compile(r"-(\d{4}-\d{2}-\d{2}|\d{8})$")


class PriceTable:
    """Look up prices by model string; dated snapshots fall back to their base model.

    ``openai:gpt-4.1-mini-2025-04-14`` finds ``openai:gpt-4.1-mini``; any other unknown name
    (``openai:gpt-5.5-pro-preview``) has no price. A name without its provider
    (``gpt-5-mini``, as in ``--model sim:gpt-5-mini``) finds the one provider's model of that
    name. Overrides (from ``--price-in/--price-out`` or the library) take precedence over the
    table.
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
        self._rates: dict[str, PicoRates | None] = {}

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
        snapshot = _SNAPSHOT.search(model)
        if found is None and snapshot is not None:
            # Dated snapshots ("gpt-4.1-mini-2025-04-14", "claude-sonnet-4-5-20250929") share
            # the base model's price. Only a date: "gpt-5.5-pro" is not "gpt-5.5" (6x dearer).
            found = self._prices.get(model[: snapshot.start()])
        if found is None and ":" not in model:
            found = self._unique_provider_price(model)
        self._cache[model] = found
        return found

    def _unique_provider_price(self, name: str) -> Price | None:
        """The price of ``<provider>:<name>`` when exactly one provider has it: a bare name
        left the record's costs at zero, every call unpriced, while the table knew it."""
        providers = dict.fromkeys(key.partition(":")[0] for key in self._prices if ":" in key)
        found = [p for p in (self.lookup(f"{prov}:{name}") for prov in providers) if p]
        return found[0] if len(found) == 1 else None

    def cost(self, model: str, usage: Usage) -> float | None:
        """USD cost of ``usage`` on ``model``, or ``None`` when the price is unknown."""
        price = self.lookup(model)
        return None if price is None else price.cost(usage)

    def rates(self, model: str) -> PicoRates | None:
        """The pico-dollar rates of ``model``, or ``None`` when its price is unknown."""
        try:
            return self._rates[model]
        except KeyError:
            price = self.lookup(model)
            found = self._rates[model] = None if price is None else price.pico_rates()
            return found

    def models(self) -> list[str]:
        """Every model string in the table."""
        return sorted(self._prices)
