"""The models of a run: what a spec names (a model string, a provider's :class:`ModelSpec`,
the :class:`~hierplan.Simulator`, or a model object) resolved to models, provider adapters
opened once and closed after, and the price each model is charged at."""

from __future__ import annotations

import math
from typing import Any

from hierplan.errors import UserInputError
from hierplan.models import provider_model
from hierplan.models.base import Model, close_model, parse_model_string
from hierplan.pricing import Price, PriceTable, with_anthropic_cache_writes
from hierplan.runner.spec import ModelChoice, ModelSpec, RunSpec, check_base_url, is_simulated
from hierplan.simulator.model import SimulatedModel
from hierplan.simulator.oracle import Oracle
from hierplan.simulator.profiles import DEFAULT_SIMULATED_PRICED_AS, NoiseProfile, Simulator

__all__ = [
    "SIMULATOR_ONLY",
    "Models",
    "check_base_url",
    "is_simulated",
    "priced_as_of",
    "provider_spec",
    "resolve_model",
    "with_price",
]


def resolve_model(
    spec: str | Model,
    *,
    oracle: Oracle | None = None,
    profile: NoiseProfile | str = "typical",
    seed: int = 0,
    latency_scale: float = 1.0,
    priced_as: str | None = None,
    **provider_options: Any,
) -> Model:
    """A :class:`~hierplan.Model` for ``spec`` (a model string, or a model returned as is).

    ``sim`` builds a :class:`~hierplan.SimulatedModel` on ``oracle`` with the simulator's
    ``profile``, ``seed`` and ``latency_scale`` (``sim:<model>`` prices it as that model);
    a provider's string builds its adapter with ``provider_options`` (see
    :func:`hierplan.models.provider_model`).
    """
    if not isinstance(spec, str):
        return spec
    parsed = parse_model_string(spec)
    if parsed.provider != "sim":
        return provider_model(spec, priced_as=priced_as, **provider_options)
    return SimulatedModel(
        oracle,
        profile=profile,
        seed=seed,
        latency_scale=latency_scale,
        priced_as=parsed.name or priced_as or DEFAULT_SIMULATED_PRICED_AS,
    )


def priced_as_of(model: ModelChoice) -> str:
    """The model whose price applies to ``model``, without building it."""
    if isinstance(model, Simulator):
        return model.priced_as or DEFAULT_SIMULATED_PRICED_AS
    if isinstance(model, ModelSpec):
        return model.priced_as or str(parse_model_string(model.name))
    if not isinstance(model, str):
        return model.priced_as
    parsed = parse_model_string(model)
    if parsed.provider == "sim":
        return parsed.name or DEFAULT_SIMULATED_PRICED_AS
    return str(parsed)


def with_price(
    pricing: PriceTable, price_in: float | None, price_out: float | None, models: list[str]
) -> PriceTable:
    """``pricing`` with ``price_in``/``price_out`` (USD per million tokens) set for ``models``."""
    if price_in is None and price_out is None:
        return pricing
    if price_in is None or price_out is None:
        raise UserInputError("give both --price-in and --price-out (USD per million tokens)")
    for label, value in (("--price-in", price_in), ("--price-out", price_out)):
        if not math.isfinite(value) or value < 0:
            raise UserInputError(f"{label} must be a number >= 0 (USD per million tokens)")
    price = Price(price_in, price_out, source="override")
    for name in dict.fromkeys(models):
        # Anthropic bills cache writes above the input price given, whatever that price is.
        given = with_anthropic_cache_writes(price) if name.startswith("anthropic:") else price
        pricing = pricing.with_override(name, given)
    return pricing


def run_pricing(spec: RunSpec) -> PriceTable:
    """The price table of a run: the spec's (or the built-in one), with its price override
    set for the run's models."""
    executor = spec.model if spec.executor_model is None else spec.executor_model
    priced = [priced_as_of(spec.model), priced_as_of(executor)]
    return with_price(spec.pricing or PriceTable(), spec.price_in, spec.price_out, priced)


class Models:
    """The models a run resolves: one provider adapter (and SDK client) per model, opened
    before anything else and closed when the run ends; the simulator built on the run's
    oracle and seed."""

    def __init__(self, seed: int) -> None:
        self.seed = seed
        self.opened: dict[str, Model] = {}

    def open_providers(self, *choices: ModelChoice | None) -> None:
        """Open the provider models among ``choices`` now (API keys are checked here)."""
        for choice in choices:
            if choice is not None and not is_simulated(choice) and not _is_model(choice):
                self.get(choice, None)

    def get(self, choice: ModelChoice, oracle: Oracle | None) -> Model:
        """The model for ``choice``; a simulator is built anew on ``oracle`` each time."""
        if _is_model(choice):
            return choice  # type: ignore[return-value]
        if isinstance(choice, Simulator) or is_simulated(choice):
            return _simulator(choice, oracle, self.seed)
        spec = provider_spec(choice)
        key = spec.model_dump_json()
        if key not in self.opened:
            self.opened[key] = provider_model(spec.name, **spec.adapter_options())
        return self.opened[key]

    async def aclose(self) -> None:
        """Close what was opened (models passed in as objects are their owner's to close)."""
        for opened in self.opened.values():
            await close_model(opened)


def provider_spec(choice: ModelChoice) -> ModelSpec:
    """``choice`` (a provider's model string or spec) as a :class:`ModelSpec`."""
    if isinstance(choice, ModelSpec):
        return choice
    assert isinstance(choice, str)
    return ModelSpec(name=choice)


def _is_model(choice: object) -> bool:
    return not isinstance(choice, str | ModelSpec | Simulator)


def _simulator(choice: ModelChoice, oracle: Oracle | None, seed: int) -> Model:
    config = choice if isinstance(choice, Simulator) else Simulator(priced_as=_priced(choice))
    return SimulatedModel(
        config.oracle or oracle,
        profile=config.profile,
        seed=seed,
        latency_scale=config.latency_scale,
        priced_as=config.priced_as or DEFAULT_SIMULATED_PRICED_AS,
    )


def _priced(choice: ModelChoice) -> str | None:
    assert isinstance(choice, str)
    return parse_model_string(choice).name or None


SIMULATOR_ONLY = (
    "--base-url and --timeout apply to real models (--model openai:<model> or "
    "anthropic:<model>), not to the simulator"
)
"""Why ``--base-url``/``--timeout`` are refused when only the simulator would answer."""
