"""The models of a run: model strings resolved to models (the simulator on the run's oracle,
provider adapters opened once and closed after), and the price each model is charged at."""

from __future__ import annotations

import math
from typing import Any
from urllib.parse import urlsplit

from hierplan.errors import UserInputError
from hierplan.models import provider_model
from hierplan.models.base import Model, close_model, parse_model_string
from hierplan.pricing import Price, PriceTable, with_anthropic_cache_writes
from hierplan.simulator.model import SimulatedModel
from hierplan.simulator.oracle import Oracle
from hierplan.simulator.profiles import DEFAULT_SIMULATED_PRICED_AS, NoiseProfile


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


def priced_as_of(spec: str | Model, priced_as: str | None = None) -> str:
    """The model whose price applies to a model string (built with the ``priced_as`` model
    option, if any) or to a model, without building it."""
    if not isinstance(spec, str):
        return spec.priced_as
    parsed = parse_model_string(spec)
    if parsed.provider == "sim":
        return parsed.name or priced_as or DEFAULT_SIMULATED_PRICED_AS
    return priced_as or str(parsed)


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


class _Models:
    """The models a run resolves from strings: one provider model (and SDK client) per model
    string, opened before anything else and closed when the run ends."""

    def __init__(self, **options: Any) -> None:
        self.options = options
        self.opened: dict[str, Model] = {}

    def open_providers(self, *specs: str | Model | None) -> None:
        """Resolve the provider models among ``specs`` now (keys are checked here)."""
        for spec in specs:
            if isinstance(spec, str) and parse_model_string(spec).provider != "sim":
                self.get(spec, None)

    def get(self, spec: str | Model, oracle: Oracle | None) -> Model:
        """The model for ``spec``; a simulator is built anew on ``oracle`` each time."""
        if isinstance(spec, str) and spec in self.opened:
            return self.opened[spec]
        built = resolve_model(spec, oracle=oracle, **self.options)
        if isinstance(spec, str) and built.provider != "sim":
            self.opened[spec] = built
        return built

    async def aclose(self) -> None:
        """Close what was opened (models passed in as objects are their owner's to close)."""
        for opened in self.opened.values():
            await close_model(opened)


SIMULATOR_ONLY = (
    "--base-url and --timeout apply to real models (--model openai:<model> or "
    "anthropic:<model>), not to the simulator"
)
"""Why ``--base-url``/``--timeout`` are refused when only the simulator would answer."""


def check_base_url(base_url: str) -> str:
    """``base_url`` if it is an http(s) URL with a host; else a :class:`UserInputError`."""
    parts = urlsplit(base_url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise UserInputError(
            f"--base-url {base_url!r} is not a URL: give one like http://localhost:8000/v1"
        )
    return base_url


def provider_options(base_url: str | None, timeout: float | None) -> dict[str, Any]:
    """The model options (``base_url``, ``timeout_s``) ``--base-url`` and ``--timeout`` give,
    for :func:`hierplan.run`'s ``model_options``."""
    options: dict[str, Any] = {}
    if base_url is not None:
        options["base_url"] = check_base_url(base_url)
    if timeout is not None:
        options["timeout_s"] = timeout
    return options


def is_simulated(model: str) -> bool:
    """Whether the model string names the offline simulator (``sim`` or ``sim:<priced-as>``),
    by the same reading of its provider as a run (``simple:x`` is no model, not the simulator)."""
    return model.partition(":")[0].strip().lower() == "sim"
