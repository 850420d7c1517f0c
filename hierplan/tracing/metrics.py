"""The metrics of model calls: ``gen_ai.client.token.usage`` and
``gen_ai.client.operation.duration`` per the GenAI conventions, and hierplan's USD cost counter."""

from __future__ import annotations

from collections.abc import Mapping

from opentelemetry import metrics
from opentelemetry.util.types import AttributeValue

from hierplan.units import Usage

TOKEN_BUCKETS: tuple[int, ...] = (
    1,
    4,
    16,
    64,
    256,
    1024,
    4096,
    16384,
    65536,
    262144,
    1048576,
    4194304,
    16777216,
    67108864,
)
"""Explicit bucket boundaries of ``gen_ai.client.token.usage`` (GenAI conventions)."""

DURATION_BUCKETS: tuple[float, ...] = (
    0.01,
    0.02,
    0.04,
    0.08,
    0.16,
    0.32,
    0.64,
    1.28,
    2.56,
    5.12,
    10.24,
    20.48,
    40.96,
    81.92,
)
"""Explicit bucket boundaries of ``gen_ai.client.operation.duration`` in seconds."""

COST_METRIC = "hierplan.client.cost"
"""The USD cost counter, by depth, phase, provider and model."""


class CallMetrics:
    """The instruments model calls are recorded with, created on one meter."""

    __slots__ = ("cost", "duration", "token_usage")

    def __init__(self, meter: metrics.Meter) -> None:
        self.token_usage = meter.create_histogram(
            "gen_ai.client.token.usage",
            unit="{token}",
            description="Number of input and output tokens used.",
            explicit_bucket_boundaries_advisory=list(TOKEN_BUCKETS),
        )
        self.duration = meter.create_histogram(
            "gen_ai.client.operation.duration",
            unit="s",
            description="GenAI operation duration.",
            explicit_bucket_boundaries_advisory=list(DURATION_BUCKETS),
        )
        self.cost = meter.create_counter(
            COST_METRIC, unit="USD", description="Cost of model calls in USD."
        )

    def record(
        self, attributes: Mapping[str, AttributeValue], seconds: float, usage: Usage | None
    ) -> None:
        """One call: how long it took and, when known, its input and output tokens."""
        self.duration.record(seconds, attributes)
        if usage is None:
            return
        for kind, tokens in (("input", usage.input_tokens), ("output", usage.output_tokens)):
            self.token_usage.record(tokens, {**attributes, "gen_ai.token.type": kind})
