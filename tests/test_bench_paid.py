"""Paid benchmarks made safe: the estimated cost first, then a question (or a refusal without
--yes), and --budget-usd capping the whole benchmark on the global ledger batch uses."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from hierplan.bench.estimate import estimate_cost, usd_text
from hierplan.bench.harness import BenchConfig, load_results, plan_runs
from hierplan.bench.records import NOT_STARTED
from hierplan.bench.suites import get_suite
from hierplan.cli import app


def bench(*args: str, **kwargs: Any) -> Any:
    return CliRunner().invoke(app, ["bench", *args], **kwargs)


PAID = ["--suite", "tot24", "--strategies", "react,dag", "--tasks", "2", "--seeds", "1",
        "--model", "openai:gpt-5-mini", "--no-plot"]  # fmt: skip


@pytest.mark.anyio
async def test_the_estimate_is_tasks_times_seeds_times_strategies_times_a_run_s_cost() -> None:
    config = BenchConfig(suites=("tot24", "planbench"), strategies=("react", "dag"), tasks=3,
                         seeds=2, model="openai:gpt-5-mini")  # fmt: skip
    runs = plan_runs(config)
    estimate = await estimate_cost(config, runs)
    assert estimate.runs == len(runs) == 2 * 3 * 2 * 2
    for suite in estimate.suites:
        assert (suite.tasks, suite.seeds, suite.strategies) == (3, 2, 2)
        assert suite.runs == 12 and suite.per_run_usd is not None and suite.per_run_usd > 0
        assert suite.usd == pytest.approx(suite.per_run_usd * suite.runs)
    assert estimate.usd == pytest.approx(math.fsum(s.usd or 0 for s in estimate.suites))
    text = "\n".join(estimate.lines())
    assert "tot24: 3 tasks × 2 seeds × 2 strategies = 12 runs" in text
    assert "priced as openai:gpt-5-mini" in text and "$0.25 / $2 per 1M" in text


def test_amounts_below_a_cent_keep_two_significant_digits() -> None:
    shown = [usd_text(x) for x in (0.00048, 0.0099, 0.01, 12.345, 0.0)]
    assert shown == ["$0.00048", "$0.0099", "$0.01", "$12.35", "$0.00"]


@pytest.mark.anyio
async def test_a_model_without_a_price_has_no_estimate() -> None:
    config = BenchConfig(suites=("tot24",), strategies=("react",), tasks=1,
                         model="openai:my-local-model")  # fmt: skip
    estimate = await estimate_cost(config, plan_runs(config))
    assert estimate.usd is None
    assert "Estimated cost: unknown" in "\n".join(estimate.lines())


def test_a_paid_bench_is_refused_without_yes_where_nobody_can_answer(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
    out = tmp_path / "never"
    result = bench(*PAID, "--out", str(out))
    assert result.exit_code == 2
    assert "This bench makes 4 runs on openai:gpt-5-mini" in result.stdout
    assert "2 tasks × 1 seeds × 2 strategies = 4 runs" in result.stdout
    assert result.stderr.startswith("error: this bench on openai:gpt-5-mini would cost about $")
    assert "pass --yes to start it" in result.stderr
    assert not out.exists()


def test_a_declined_estimate_starts_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
    monkeypatch.setattr("hierplan.cli.bench.can_ask", lambda: True)
    out = tmp_path / "never"
    result = bench(*PAID, "--out", str(out), input="n\n")
    assert result.exit_code == 1
    assert "Start it? [y/N]" in result.stdout and "not started" in result.stdout
    assert not out.exists()


def test_an_agreed_estimate_runs_the_bench(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from wire import TEST_KEY, OracleBackend, WireServer

    monkeypatch.setenv("OPENAI_API_KEY", TEST_KEY)
    monkeypatch.setattr("hierplan.cli.bench.can_ask", lambda: True)
    out = tmp_path / "paid"
    with WireServer(OracleBackend(get_suite("tot24").oracle())) as server:
        result = bench(*PAID, "--base-url", server.base_url("openai"), "--sim-latency-scale",
                       "0", "--out", str(out), input="y\n")  # fmt: skip
    assert result.exit_code == 0, result.output
    assert "Estimated cost: ~$" in result.stdout
    records = load_results(out / "results.jsonl")
    assert len(records) == 4 and all(r["success"] for r in records)
    assert "--yes" not in (out / "summary.md").read_text()  # a rerun asks again


SIM = ["--suite", "tot24", "--strategies", "react,dag", "--tasks", "5", "--seeds", "1",
       "--sim-latency-scale", "0", "--sim-profile", "ideal", "--concurrency", "1",
       "--no-plot"]  # fmt: skip


def test_budget_usd_caps_the_whole_bench_and_records_what_could_not_start(tmp_path: Path) -> None:
    out = tmp_path / "b"
    result = bench(*SIM, "--budget-usd", "0.002", "--out", str(out))
    assert result.exit_code == 0, result.output
    records = load_results(out / "results.jsonl")
    assert len(records) == 10
    skipped = [r for r in records if r["outcome"] == NOT_STARTED]
    ran = [r for r in records if r["outcome"] != NOT_STARTED]
    assert skipped and ran
    assert all(r["status"] == "not_started" and "budget" in r["error"] for r in skipped)
    assert math.fsum(r["cost_usd"] for r in ran) <= 0.002
    text = " ".join(result.output.split())
    assert f"note: {len(skipped)} runs could not start within --budget-usd" in text
    summary = (out / "summary.md").read_text()
    assert f"Runs the budget could not start: {len(skipped)}. They are in no figure." in summary
    assert "--budget-usd 0.002" in summary
    # A resume with more budget runs what could not start; the spend so far counts against it.
    again = bench(*SIM, "--budget-usd", "1", "--resume", "--out", str(out))
    assert again.exit_code == 0, again.output
    latest = {(r["task_id"], r["strategy"]): r for r in load_results(out / "results.jsonl")}
    assert len(latest) == 10 and all(r["outcome"] == "success" for r in latest.values())
    assert "could not start" not in (out / "summary.md").read_text()


def test_budget_usd_needs_a_price(tmp_path: Path) -> None:
    result = bench(*SIM, "--model", "sim:my-local-llama", "--budget-usd", "1", "--out",
                   str(tmp_path / "never"))  # fmt: skip
    assert result.exit_code == 2
    assert "no price is known for model 'my-local-llama'" in result.stderr
    assert not (tmp_path / "never").exists()
