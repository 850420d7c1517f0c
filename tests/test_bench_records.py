"""What a benchmark leaves: rows and bench.json that say where they come from, a results.jsonl
that loads into pandas as it is, each run's run.json, and the figure."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
from typer.testing import CliRunner

from hierplan.bench import provenance
from hierplan.bench.harness import load_results
from hierplan.bench.plot import cost_latency_figure, strategy_colour
from hierplan.bench.report import summarize
from hierplan.cli import app
from hierplan.records import RunResult
from hierplan.simulator.profiles import NoiseProfile

COMMON = ["--suite", "tot24,parallel_qa", "--strategies", "react,dag", "--tasks", "2",
          "--seeds", "2", "--sim-latency-scale", "0", "--no-plot"]  # fmt: skip


def bench(*args: str) -> Any:
    return CliRunner().invoke(app, ["bench", *args])


@pytest.fixture(scope="module")
def made(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("made") / "b"
    result = bench(*COMMON, "--save-runs", "--out", str(out))
    assert result.exit_code == 0, result.output
    # Said on the terminal too, where the latencies are shown.
    assert "note: latencies are CPU time only" in " ".join(result.output.split())
    return out


def test_every_row_and_bench_json_say_what_made_them(made: Path) -> None:
    version = provenance.code_version()
    manifest = json.loads((made / "bench.json").read_text())
    assert manifest["code"] == version
    assert manifest["price"]["price_model"] == "openai:gpt-5-mini"
    assert manifest["profile"] == NoiseProfile.model_validate(manifest["profile"]).model_dump()
    knobs = {f"sim_{k}" for k in NoiseProfile.model_fields if k != "name"}
    for row in load_results(made / "results.jsonl"):
        assert row["hierplan_version"] == version["hierplan_version"]
        assert row["commit"] == version["commit"] and row["dirty"] == version["dirty"]
        assert set(row) >= knobs and row["profile"] == "typical"
        assert row["latency_scale"] == 0.0 and row["latency_cpu_only"] is True
        assert row["price_in_per_mtok"] > 0 and row["price_out_per_mtok"] > 0
    summary = (made / "summary.md").read_text()
    assert provenance.describe_version(version) in summary
    assert "Latencies are CPU time only" in summary
    assert "Model sim priced as openai:gpt-5-mini: $0.25 / $2 per 1M" in summary


def test_the_code_version_names_the_commit_of_this_checkout() -> None:
    version = provenance.code_version()
    assert version["commit"] is not None and len(version["commit"]) == 40
    assert isinstance(version["dirty"], bool)
    assert (version["source_digest"] is not None) == version["dirty"]


def test_results_load_into_pandas_as_they_are(made: Path) -> None:
    frame = pd.read_json(made / "results.jsonl", lines=True)
    assert len(frame) == 2 * 2 * 2 * 2
    for column in frame.columns:
        values = frame[column].dropna().tolist()
        assert not any(isinstance(v, dict | list) for v in values), column
    assert {"task_name", "param_rank", "param_numbers", "outcome", "commit"} <= set(frame.columns)
    by_strategy = frame.groupby("strategy")["success"].mean()
    assert set(by_strategy.index) == {"react", "dag"}
    ranks = frame.loc[frame["suite"] == "tot24", "param_rank"].dropna().astype(int)
    assert set(ranks) == {901, 902}


def test_save_runs_keeps_each_run_s_run_json_beside_the_results(made: Path) -> None:
    rows = load_results(made / "results.jsonl")
    for row in rows:
        path = made / row["run_json"]
        assert path.is_file(), row["run_json"]
        record = RunResult.load(path)
        assert record.run_id == row["run_id"]
        assert record.verification is not None
        assert record.verification["ok"] == row["goal_reached"]
    assert len({r["run_json"] for r in rows}) == len(rows)


def test_resume_refuses_a_directory_another_commit_made(
    made: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    out = tmp_path / "copy"
    out.mkdir()
    for name in ("bench.json", "results.jsonl"):
        (out / name).write_text((made / name).read_text())
    other = dict(provenance.code_version(), commit="0" * 40, dirty=False, source_digest=None)
    monkeypatch.setattr("hierplan.bench.harness.code_version", lambda: other)
    result = bench(*COMMON, "--save-runs", "--resume", "--out", str(out))
    assert result.exit_code == 2
    text = " ".join(result.stderr.split())
    assert "it was made with other settings (the code's commit:" in text
    assert f'"{"0" * 40}" now' in text


def test_one_colour_per_strategy_in_every_panel_and_figure(made: Path) -> None:
    summary = summarize(load_results(made / "results.jsonl"), reps=100)
    figure = cost_latency_figure(summary)
    axes = figure.axes
    assert len(axes) == 2 * 2  # per suite: cost and latency against success
    assert [ax.get_title() for ax in axes] == [
        "parallel_qa: cost",
        "parallel_qa: latency",
        "tot24: cost",
        "tot24: latency",
    ]
    for ax in axes:
        for container in ax.containers:  # one error bar a strategy, with both intervals
            label = container.get_label()
            colour = container.lines[0].get_color()
            assert colour == strategy_colour(label)
    cost = axes[0]
    assert any(c.has_xerr and c.has_yerr for c in cost.containers)  # cost error bars
    assert strategy_colour("react") == "C0" and strategy_colour("dag") == "C3"
    assert "CPU time only" in axes[1].get_xlabel()
