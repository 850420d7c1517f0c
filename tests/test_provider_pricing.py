"""The price table's provider entries: sourced, dated, and unknown models fail closed."""

from __future__ import annotations

import re
from dataclasses import replace
from pathlib import Path

import pytest

import hierplan
from hierplan.pricing import DEFAULT_PRICES, Price, PriceTable
from hierplan.units import Usage


def test_every_entry_names_its_source_and_date() -> None:
    for model, price in DEFAULT_PRICES.items():
        assert model.split(":")[0] in ("openai", "anthropic")
        assert price.source.startswith("https://"), model
        assert re.fullmatch(r"\d{4}-\d{2}-\d{2}", price.as_of), model
        assert 0 < price.input_per_mtok <= price.output_per_mtok, model
        cached = price.cached_input_per_mtok
        assert cached is None or cached < price.input_per_mtok, model


@pytest.mark.parametrize(
    ("model", "entry"),
    [
        ("openai:gpt-5.4-mini-2026-03-17", "openai:gpt-5.4-mini"),
        ("openai:gpt-4.1-mini-2025-04-14", "openai:gpt-4.1-mini"),
        ("anthropic:claude-haiku-4-5-20251001", "anthropic:claude-haiku-4-5"),
        ("anthropic:claude-sonnet-4-5-20250929", "anthropic:claude-sonnet-4-5"),
        ("openai:gpt-5.5-pro", "openai:gpt-5.5-pro"),
        ("openai:gpt-4o-2024-08-06", "openai:gpt-4o"),
        # a snapshot priced apart from its base model keeps its own price
        ("openai:gpt-4o-2024-05-13", "openai:gpt-4o-2024-05-13"),
    ],
)
def test_dated_snapshots_take_their_base_models_price(model: str, entry: str) -> None:
    assert PriceTable().lookup(model) == DEFAULT_PRICES[entry]


@pytest.mark.parametrize(
    "model",
    ["openai:gpt-5.5-preview", "openai:gpt-5-chat-latest", "anthropic:claude-opus-5", "openai:x"],
)
def test_other_unknown_models_have_no_price(model: str) -> None:
    # "gpt-5.5-preview" is not "gpt-5.5": a guessed price could be far off, so none is given
    assert PriceTable().lookup(model) is None
    assert PriceTable().cost(model, Usage(1000, 1000)) is None


def test_cached_input_is_charged_at_the_cache_rate() -> None:
    table = PriceTable()
    usage = Usage(input_tokens=1_000_000, output_tokens=0, cached_input_tokens=800_000)
    assert table.cost("openai:gpt-5.4", usage) == pytest.approx(0.2 * 2.50 + 0.8 * 0.25)
    assert table.cost("anthropic:claude-opus-4-8", usage) == pytest.approx(0.2 * 5 + 0.8 * 0.5)


def test_anthropic_cache_writes_cost_what_anthropic_bills() -> None:
    # 1.25x the input price for a five-minute write, 2x for a one-hour write, 0.1x for a read
    table = PriceTable()
    writes = Usage(input_tokens=1_000_000, output_tokens=0, cache_write_tokens=1_000_000)
    assert table.cost("anthropic:claude-sonnet-4-6", writes) == pytest.approx(3.75)
    hour = replace(writes, cache_write_1h_tokens=1_000_000)
    assert table.cost("anthropic:claude-sonnet-4-6", hour) == pytest.approx(6.00)
    mixed = Usage(
        input_tokens=1_000_000,
        output_tokens=1_000_000,
        cached_input_tokens=400_000,
        cache_write_tokens=500_000,
        cache_write_1h_tokens=200_000,
    )
    expected = 0.1 * 1 + 0.4 * 0.1 + 0.3 * 1.25 + 0.2 * 2 + 5  # claude-haiku-4-5: $1 in, $5 out
    assert table.cost("anthropic:claude-haiku-4-5", mixed) == pytest.approx(expected)


def test_every_anthropic_entry_has_cache_write_rates_and_no_openai_entry_does() -> None:
    for model, price in DEFAULT_PRICES.items():
        if model.startswith("anthropic:"):
            assert price.cache_write_per_mtok == pytest.approx(price.input_per_mtok * 1.25)
            assert price.cache_write_1h_per_mtok == pytest.approx(price.input_per_mtok * 2)
        else:  # OpenAI bills no cache-write surcharge: a write costs plain input
            assert price.cache_write_per_mtok is None and price.cache_write_1h_per_mtok is None
    usage = Usage(1_000_000, 0, cache_write_tokens=600_000, cache_write_1h_tokens=100_000)
    assert PriceTable().cost("openai:gpt-5.4", usage) == pytest.approx(2.50)


@pytest.mark.parametrize(
    ("model", "entry"),
    [
        ("gpt-5-mini", "openai:gpt-5-mini"),
        ("gpt-4o-2024-08-06", "openai:gpt-4o"),
        ("claude-haiku-4-5-20251001", "anthropic:claude-haiku-4-5"),
    ],
)
def test_a_name_without_its_provider_takes_the_one_providers_price(model: str, entry: str) -> None:
    assert PriceTable().lookup(model) == DEFAULT_PRICES[entry]


def test_a_bare_name_two_providers_share_has_no_price() -> None:
    both = Price(1.0, 2.0, source="https://example.com/a", as_of="2026-01-01")
    table = PriceTable({"openai:m": both, "anthropic:m": replace(both, input_per_mtok=3.0)})
    assert table.lookup("m") is None and table.lookup("nobody-has-this") is None


def test_the_simulator_priced_as_a_bare_model_name_reports_its_cost(tmp_path: Path) -> None:
    # --model sim:gpt-5-mini left every call unpriced and the run's cost at zero
    result = hierplan.run_sync(
        scenario="data_migration",
        model=hierplan.Simulator(latency_scale=0, priced_as="gpt-5-mini"),
        workdir=tmp_path,
    )
    totals = result.totals()
    assert totals["unpriced_calls"] == 0 and totals["cost_usd"] > 0


def test_a_price_given_for_an_anthropic_model_bills_its_cache_writes_from_it() -> None:
    from hierplan.runner.models import with_price

    table = with_price(PriceTable(), 2.0, 8.0, ["anthropic:claude-local", "openai:local"])
    usage = Usage(1_000_000, 0, cache_write_tokens=1_000_000, cache_write_1h_tokens=400_000)
    assert table.cost("anthropic:claude-local", usage) == pytest.approx(0.6 * 2.5 + 0.4 * 4.0)
    assert table.cost("openai:local", usage) == pytest.approx(2.0)
