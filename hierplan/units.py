"""The units every layer counts in: :class:`Usage` (the tokens of a model call) and
pico-dollars (10^-12 USD, whole numbers, so that sums of costs are exact)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from decimal import Decimal


@dataclass(slots=True, frozen=True)
class Usage:
    """Tokens used by one model call (or a sum of calls).

    ``cached_input_tokens`` (prompt-cache reads) and ``cache_write_tokens`` (input written to a
    prompt cache) are disjoint subsets of input tokens, and ``cache_write_1h_tokens`` the part of
    the writes kept for an hour rather than five minutes; ``reasoning_tokens`` is a subset of
    output tokens. Each is reported when the provider reports it (only Anthropic bills cache
    writes apart from other input, so only its adapter sets them).
    """

    input_tokens: int = 0
    output_tokens: int = 0
    cached_input_tokens: int = 0
    reasoning_tokens: int = 0
    cache_write_tokens: int = 0
    cache_write_1h_tokens: int = 0

    @property
    def total_tokens(self) -> int:
        """Input plus output tokens."""
        return self.input_tokens + self.output_tokens

    def possible(self) -> Usage:
        """This usage if it can be (no negative count, no more cache reads and writes than
        input, no more hour-long writes than writes, no more reasoning than output), else the
        nearest usage that can."""
        # One chained comparison for the usual case: this runs for every model call.
        if (
            self.cached_input_tokens >= 0
            and self.input_tokens - self.cached_input_tokens
            >= self.cache_write_tokens
            >= self.cache_write_1h_tokens
            >= 0
            and self.output_tokens >= self.reasoning_tokens >= 0
        ):
            return self
        inp, out = max(0, self.input_tokens), max(0, self.output_tokens)
        cached = min(max(0, self.cached_input_tokens), inp)
        written = min(max(0, self.cache_write_tokens), inp - cached)
        return Usage(
            inp,
            out,
            cached,
            min(max(0, self.reasoning_tokens), out),
            written,
            min(max(0, self.cache_write_1h_tokens), written),
        )

    def __add__(self, other: Usage) -> Usage:
        return Usage(
            self.input_tokens + other.input_tokens,
            self.output_tokens + other.output_tokens,
            self.cached_input_tokens + other.cached_input_tokens,
            self.reasoning_tokens + other.reasoning_tokens,
            self.cache_write_tokens + other.cache_write_tokens,
            self.cache_write_1h_tokens + other.cache_write_1h_tokens,
        )


PICO_PER_USD = 10**12


def usd_to_pico(usd: float) -> int:
    """USD as whole pico-dollars, rounded down (a budget never grows by rounding)."""
    return math.floor(Decimal(repr(float(usd))) * PICO_PER_USD)


def rate_to_pico(usd_per_mtok: float) -> int:
    """A price in USD per million tokens as pico-dollars per token, rounded up (a cost never
    shrinks by rounding). ``$0.25 / 1M`` is 250,000 pico-dollars per token."""
    return math.ceil(Decimal(repr(float(usd_per_mtok))) * (PICO_PER_USD // 1_000_000))


def pico_to_usd(pico: int) -> float:
    """Pico-dollars as USD (for display and records)."""
    return pico / PICO_PER_USD
