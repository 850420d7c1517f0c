"""The benchmark harness and ``hierplan bench`` end to end, resume, bad arguments, its docs page."""

from __future__ import annotations

import builtins
import csv
import json
import re
import shlex
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from hierplan.bench.harness import BenchConfig, check_config, load_results, run_bench
from hierplan.bench.plot import plot_cost_success
from hierplan.bench.report import summarize
from hierplan.bench.suites import SUITE_NAMES
from hierplan.bench.tables import markdown
from hierplan.cli import app
from hierplan.core.settings import STRATEGY_NAMES
from hierplan.errors import UnexpectedModelCall, UserInputError
from hierplan.models.base import ModelRequest, ModelResponse
from hierplan.models.scripted import FunctionModel, plan_response
from hierplan.plans.plan import Plan, Step
from hierplan.simulator.model import SimulatedModel
from hierplan.simulator.profiles import PROFILES

BENCH_PAGE = Path(__file__).parent.parent / "docs" / "bench.md"
FIELDS = {
    "suite", "task_id", "seed", "strategy", "model", "simulated", "profile", "success", "status",
    "planner_input_tokens", "planner_output_tokens", "executor_input_tokens",
    "executor_output_tokens", "tokens", "model_calls", "tool_calls", "replans", "depth",
    "latency_s", "critical_path_s", "cost_usd",
}  # fmt: skip


def bench(*args: str) -> Any:
    return CliRunner().invoke(app, ["bench", *args])


def test_small_run_end_to_end_with_all_six_strategies(tmp_path: Path) -> None:
    out = tmp_path / "b"
    result = bench("--tasks", "1", "--seeds", "2", "--sim-latency-scale", "0", "--concurrency",
                   "16", "--out", str(out))  # fmt: skip
    assert result.exit_code == 0, result.output
    records = load_results(out / "results.jsonl")
    # planbench_oneshot is PlanBench's own setting: plan-execute only.
    expected = {(s, t) for s in SUITE_NAMES for t in STRATEGY_NAMES if s != "planbench_oneshot"}
    expected.add(("planbench_oneshot", "plan-execute"))
    assert len(records) == len(expected) * 2
    assert {(r["suite"], r["strategy"]) for r in records} == expected
    for r in records:
        assert set(r) >= FIELDS, FIELDS - set(r)
        assert r["simulated"] is True and r["profile"] == "typical"
        assert (r["critical_path_s"] is not None) == (r["suite"] == "parallel_qa")
        if r["strategy"] == "react":  # no planner: every token is the executor's
            assert r["planner_input_tokens"] == 0 and r["executor_input_tokens"] > 0
            assert r["depth"] == 1
        elif r["strategy"] == "as-needed":  # plans only when the direct attempt fails
            assert r["executor_input_tokens"] > 0 and r["depth"] >= 2
        else:
            assert r["planner_input_tokens"] > 0 and r["depth"] >= 2
        assert r["model_calls"] >= 1 and r["cost_usd"] > 0
    assert sum(r["success"] for r in records) >= len(records) * 0.7
    summary = (out / "summary.md").read_text()
    assert summary.startswith("# Strategy benchmark — SIMULATED (profile typical, model sim)")
    assert "hierplan bench --suite " + ",".join(SUITE_NAMES) in summary
    for suite in SUITE_NAMES:
        assert f"## {suite}" in summary
    rows = list(csv.DictReader((out / "summary.csv").read_text().splitlines()))
    assert {r["strategy"] for r in rows} == set(STRATEGY_NAMES)
    assert all(r["simulated"] == "true" for r in rows)
    paired = list(csv.DictReader((out / "paired.csv").read_text().splitlines()))
    assert {r["baseline"] for r in paired} == {"react"}
    assert {r["strategy"] for r in paired} == set(STRATEGY_NAMES) - {"react"}
    assert "planbench_oneshot" not in {r["suite"] for r in paired}  # no react run to pair
    assert (out / "cost_vs_success.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "SIMULATED" in result.output


def test_unpriced_runs_have_no_cost_rather_than_a_cost_of_zero(tmp_path: Path) -> None:
    # priced as a model the price table does not know: every call is unpriced
    out = tmp_path / "u"
    result = bench("--model", "sim:my-local-llama", "--suite", "game24", "--strategies", "dag",
                   "--tasks", "2", "--seeds", "1", "--sim-latency-scale", "0",
                   "--out", str(out))  # fmt: skip
    assert result.exit_code == 0, result.output
    records = load_results(out / "results.jsonl")
    assert records and all(r["cost_usd"] is None and r["unpriced_calls"] > 0 for r in records)
    text = " ".join(result.output.split())
    assert "note: 2 of 2 runs made calls of no known price" in text
    assert "note: no cost-vs-success plot: no run has a known cost above zero" in text
    assert "note: no paired differences: the baseline react was not among" in text
    rows = list(csv.DictReader((out / "summary.csv").read_text().splitlines()))
    (cost,) = [r for r in rows if r["metric"] == "cost_usd"]
    assert cost["n"] == "0"  # no known cost, not a mean of zeros
    assert not (out / "cost_vs_success.png").exists()


def test_runs_that_raised_are_counted_out_loud(tmp_path: Path) -> None:
    """A run that raised has no cost or latency: the tables say how many such runs were left
    out of those figures, rather than letting the strategy look cheaper."""
    out = tmp_path / "e"
    common = ["--suite", "game24", "--strategies", "react", "--tasks", "2", "--seeds", "1",
              "--sim-latency-scale", "0", "--no-plot", "--out", str(out)]  # fmt: skip
    assert bench(*common).exit_code == 0
    results = out / "results.jsonl"
    first, second = load_results(results)
    usage = ("cost_usd", "tokens", "latency_s", "model_calls", "tool_calls", "replans", "depth")
    raised = {k: v for k, v in first.items() if k not in usage and not k.endswith("_tokens")}
    raised |= {"success": False, "outcome": "error", "status": "error",
               "error": "ModelError: gone"}  # fmt: skip
    results.write_text(json.dumps(raised) + "\n" + json.dumps(second) + "\n")
    result = bench(*common, "--resume")
    assert result.exit_code == 0, result.output
    text = " ".join(result.output.split())
    assert (
        "note: runs that ended in an error: 1 of 2. They count as failures, but their cost" in text
    )
    summary = (out / "summary.md").read_text()
    assert "Runs that ended in an error: 1. They count as failures" in summary
    rows = list(csv.DictReader((out / "summary.csv").read_text().splitlines()))
    assert {r["metric"]: r["n"] for r in rows}["cost_usd"] == "1"


def test_resume_runs_only_what_is_missing(tmp_path: Path) -> None:
    out = tmp_path / "r"
    common = ["--suite", "game24", "--strategies", "react,dag", "--tasks", "2",
              "--sim-latency-scale", "0", "--no-plot", "--out", str(out)]  # fmt: skip
    assert bench(*common, "--seeds", "1").exit_code == 0
    again = bench(*common, "--seeds", "1")
    assert again.exit_code == 2
    assert "already exists: pass --resume" in again.stderr
    assert bench(*common, "--seeds", "2", "--resume").exit_code == 0
    records = load_results(out / "results.jsonl")
    keys = [(r["task_id"], r["seed"], r["strategy"]) for r in records]
    assert len(keys) == len(set(keys)) == 2 * 2 * 2
    other = bench(*common, "--seeds", "2", "--resume", "--sim-profile", "weak")
    assert other.exit_code == 2
    assert "made with other settings" in other.stderr


def test_the_command_in_the_summary_resumes_the_same_benchmark(tmp_path: Path) -> None:
    """The command summary.md gives reproduces the settings exactly, even those with more
    digits than a short format keeps, so that it can resume the benchmark it describes."""
    out = tmp_path / "c"
    args = ["--suite", "game24", "--strategies", "react", "--tasks", "1", "--seeds", "1",
            "--sim-latency-scale", "0.00012345678", "--sim-plan-error-rate", "0.123456789",
            "--no-plot", "--out", str(out)]  # fmt: skip
    assert bench(*args).exit_code == 0
    text = (out / "summary.md").read_text()
    found = re.search(r"```\n(hierplan bench .*)\n```", text)
    assert found is not None, text
    command = shlex.split(found.group(1))
    assert "0.00012345678" in command and "0.123456789" in command
    again = bench(*command[2:], "--resume", "--no-plot")
    assert again.exit_code == 0, again.output


def test_set_gives_every_run_a_setting_the_summary_command_repeats(tmp_path: Path) -> None:
    out = tmp_path / "s"
    args = ["--suite", "game24", "--strategies", "react,dag", "--tasks", "1", "--seeds", "1",
            "--sim-latency-scale", "0", "--no-plot", "--out", str(out),
            "--set", "max_retries=0", "--set", "step_timeout_s=null",
            "--set", "retry_backoff_s=0.0123456789"]  # fmt: skip
    first = bench(*args)
    assert first.exit_code == 0, first.output
    manifest = json.loads((out / "bench.json").read_text())
    assert manifest["run_settings"] == {
        "max_retries": 0,
        "step_timeout_s": None,
        "retry_backoff_s": 0.0123456789,
    }
    found = re.search(r"```\n(hierplan bench .*)\n```", (out / "summary.md").read_text())
    assert found is not None
    command = shlex.split(found.group(1))
    assert "retry_backoff_s=0.0123456789" in command and "step_timeout_s=null" in command
    assert bench(*command[2:], "--resume", "--no-plot").exit_code == 0
    other = bench(*args[:-6], "--resume", "--set", "max_retries=1")
    assert other.exit_code == 2 and "made with other settings" in other.output
    refused = bench(*args[:-6], "--set", "seed=1")
    assert refused.output.strip() == "error: --set seed: use --seeds"


def test_a_torn_last_line_is_skipped_on_resume(tmp_path: Path) -> None:
    path = tmp_path / "results.jsonl"
    path.write_text('{"a": 1}\n{"b": 2}\n{"c": ')
    assert load_results(path) == [{"a": 1}, {"b": 2}]
    path.write_text('{"a": 1}\nnot json\n{"b": 2}\n')
    with pytest.raises(UserInputError, match="line 2 is not JSON"):
        load_results(path)


@pytest.mark.parametrize("tail", ['{"suite": "game24", "task": 1, "task_', None])
def test_a_resume_after_an_interrupted_write_starts_its_records_on_a_line_of_their_own(
    tmp_path: Path, tail: str | None
) -> None:
    out = tmp_path / "r"
    common = ["--suite", "game24", "--strategies", "react", "--tasks", "2",
              "--sim-latency-scale", "0", "--no-plot", "--out", str(out)]  # fmt: skip
    assert bench(*common, "--seeds", "1").exit_code == 0
    results = out / "results.jsonl"
    whole = results.read_text()
    lines = whole.splitlines()
    # torn inside a record, or cut just before the newline of a whole one
    results.write_text(whole + tail if tail else whole.rstrip("\n"))
    assert bench(*common, "--seeds", "2", "--resume").exit_code == 0
    records = load_results(results)  # every line whole: a torn one would raise here
    assert len(records) == 4 and results.read_text().startswith("\n".join(lines))
    assert bench(*common, "--seeds", "2", "--resume").exit_code == 0  # and again


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--suite", "chess"], "unknown suite 'chess'"),
        (["--strategies", "react,magic"], "unknown strategy 'magic'"),
        (["--strategies", ","], "no strategies given"),
        (["--tasks", "0"], "--tasks must be 1 to 10,000 (got 0)"),
        # Tasks a goals file of hierplan batch could not name by their ids:
        (["--tasks", "10001"], "--tasks must be 1 to 10,000 (got 10001): a task's id"),
        (["--task-seed", "-1"], "--task-seed must be 0 to 999,999,999 (got -1)"),
        (["--task-seed", "1000000000"], "--task-seed must be 0 to 999,999,999"),
        (["--seeds", "-1"], "--seeds must be at least 1"),
        (["--concurrency", "0"], "--concurrency must be at least 1"),
        (["--sim-profile", "perfect"], "unknown simulator profile 'perfect'"),
        (["--sim-plan-error-rate", "1.5"], "--sim-plan-error-rate: Input should be less than"),
        (["--sim-latency-scale", "-1"], "--sim-latency-scale must be a finite number >= 0"),
        (["--sim-latency-scale", "nan"], "--sim-latency-scale must be a finite number >= 0"),
        (["--sim-latency-scale", "inf"], "--sim-latency-scale must be a finite number >= 0"),
        (["--sim-latency-median", "inf"], "--sim-latency-median: Input should be a finite"),
        (["--baseline", "magic"], "unknown --baseline 'magic'"),
        (["--model", "gpt-5"], "model"),
        (["-m", "openai:gpt-5-mini", "--base-url", "notaurl"], "--base-url 'notaurl' is not a URL"),
    ],
)
def test_bad_arguments_exit_2_with_one_line(tmp_path: Path, args: list[str], message: str) -> None:
    out = tmp_path / "never"
    result = bench(*args, "--out", str(out))
    assert result.exit_code == 2
    assert result.stderr.startswith("error: ")
    assert message in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
    assert not out.exists()


def test_bench_takes_the_model_flags_as_run_does(tmp_path: Path) -> None:
    out = tmp_path / "never"
    result = bench("-m", "openai:gpt-5-mini", "--timeout", "0", "--out", str(out))
    assert result.exit_code == 2
    assert "Invalid value for '--timeout': Input should be greater than or equal to 0.001" in (
        result.stderr
    )
    assert not out.exists()


def test_check_config_rejects_zero_tasks() -> None:
    with pytest.raises(UserInputError, match="--tasks must be 1 to 10,000 \\(got 0\\)"):
        check_config(BenchConfig(suites=("game24",), strategies=("react",), tasks=0))


@pytest.mark.anyio
@pytest.mark.parametrize("depth", [0, 11])
async def test_a_depth_out_of_range_is_refused_before_anything_is_written(
    tmp_path: Path, depth: int
) -> None:
    config = BenchConfig(suites=("game24",), strategies=("react",), tasks=1, max_depth=depth)
    with pytest.raises(UserInputError, match=f"--max-depth: .*got {depth}"):
        await run_bench(config, tmp_path / "d")
    assert not (tmp_path / "d").exists()


@pytest.mark.anyio
async def test_any_model_can_be_benchmarked(tmp_path: Path) -> None:
    """The harness is not tied to the simulator: here a model that gives up on everything."""
    seen: list[str] = []

    def answer(request: ModelRequest) -> ModelResponse:
        seen.append(request.phase)
        return ModelResponse(text="FAILED: I cannot do this")

    config = BenchConfig(suites=("game24",), strategies=("react", "plan-execute"), tasks=1,
                         latency_scale=0)  # fmt: skip
    records = await run_bench(config, tmp_path, model=FunctionModel(answer))
    assert {r["model"] for r in records} == {"function"}
    assert [r["success"] for r in records] == [False, False]
    assert set(seen) == {"planning", "execution"}


@pytest.mark.anyio
async def test_a_run_whose_parallel_steps_raise_is_a_failed_run_not_the_end_of_the_bench(
    tmp_path: Path,
) -> None:
    """A DAG's steps raise from a task group; that run is recorded as an error like a ReAct
    run raising the same error, and the benchmark goes on."""

    def answer(request: ModelRequest) -> ModelResponse:
        if request.phase == "planning":
            steps = [Step(id=s, title=s, instruction=f"do {s}") for s in ("a", "b")]
            return plan_response(Plan(goal="g", steps=steps))
        raise UnexpectedModelCall("the script is used up")

    config = BenchConfig(suites=("game24",), strategies=("react", "dag"), tasks=2,
                         latency_scale=0)  # fmt: skip
    records = await run_bench(config, tmp_path, model=FunctionModel(answer))
    assert len(records) == 4
    assert {(r["strategy"], r["status"], r["success"]) for r in records} == {
        ("react", "error", False),
        ("dag", "error", False),
    }
    assert all("the script is used up" in r["error"] for r in records)
    assert len(load_results(tmp_path / "results.jsonl")) == 4


@pytest.mark.anyio
async def test_records_name_the_model_that_ran_and_no_noise_profile_it_did_not_have(
    tmp_path: Path,
) -> None:
    """``run_bench(model=...)`` replaces the configured ``sim``: finished and errored runs alike
    name that model, and claim no simulator noise profile for it."""

    def answer(request: ModelRequest) -> ModelResponse:
        if "6, 1, 9, 5" in request.messages[-1].content:
            raise UnexpectedModelCall("the script is used up")
        return ModelResponse(text="FAILED: I cannot do this")

    config = BenchConfig(suites=("game24",), strategies=("react",), tasks=2, latency_scale=0)
    records = await run_bench(config, tmp_path, model=FunctionModel(answer))
    assert sorted(r["status"] for r in records) == ["error", "failed"]
    assert [(r["model"], r["profile"], r["simulated"]) for r in records] == [
        ("function", None, True)
    ] * 2
    summary = summarize(records, None)
    assert summary.label() == "SIMULATED (model function)"
    assert "All figures come from a test double" in markdown(summary)


@pytest.mark.anyio
async def test_a_simulator_given_as_the_model_runs_paired_like_model_sim(tmp_path: Path) -> None:
    """Each run gets its own simulator seeded by its task and seed: the runs are those of
    model "sim" with the same profile, whatever ran before them."""
    weak = PROFILES["weak"]
    config = BenchConfig(suites=("game24",), strategies=("react", "dag"), tasks=3, seeds=2,
                         latency_scale=0, profile=weak)  # fmt: skip
    given = SimulatedModel(None, profile=weak, latency_scale=0)
    by_instance = await run_bench(config, tmp_path / "i", model=given)
    by_name = await run_bench(config, tmp_path / "n")

    def outcomes(records: list[dict[str, Any]]) -> dict[tuple[str, int, str], tuple[Any, ...]]:
        fields = ("status", "success", "tokens", "model_calls", "tool_calls", "profile")
        return {
            (r["task_id"], r["seed"], r["strategy"]): tuple(r[f] for f in fields) for r in records
        }

    assert outcomes(by_instance) == outcomes(by_name)


def test_plot_needs_matplotlib_and_says_how_to_get_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    records = [
        {"suite": "game24", "strategy": "react", "task_id": "t", "seed": 0, "success": True,
         "cost_usd": 0.001, "model": "sim", "simulated": True, "profile": "typical"},
    ]  # fmt: skip
    summary = summarize(records)
    real_import = builtins.__import__

    def no_matplotlib(name: str, *args: Any, **kwargs: Any) -> Any:
        if name.startswith("matplotlib"):
            raise ImportError(name)
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_matplotlib)
    with pytest.raises(UserInputError, match=r"pip install 'hierplan\[bench\]'"):
        plot_cost_success(summary, tmp_path / "p.png")


def test_readme_bench_examples_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    commands = re.findall(r"^hierplan bench .*$", BENCH_PAGE.read_text(), flags=re.M)
    assert commands
    monkeypatch.chdir(tmp_path)
    for command in commands:
        args = shlex.split(command)[1:]
        result = CliRunner().invoke(app, args)
        assert result.exit_code == 0, result.output
        out = Path(args[args.index("--out") + 1])
        assert (out / "summary.md").exists() and (out / "results.jsonl").exists()
        assert "SIMULATED" in json.dumps(result.output)


def test_readme_documents_every_bench_flag() -> None:
    text = BENCH_PAGE.read_text()
    help_text = CliRunner().invoke(app, ["bench", "--help"], env={"COLUMNS": "200"}).output
    flags = set(re.findall(r"--[a-z][a-z-]+", help_text)) - {"--help", "--no-plot"}
    missing = sorted(f for f in flags if f not in text)
    assert missing == []


def test_example_program_runs_and_resumes(tmp_path: Path) -> None:
    import importlib.util

    import anyio

    path = Path(__file__).parent.parent / "examples" / "compare_strategies.py"
    spec = importlib.util.spec_from_file_location("compare_strategies", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    first = anyio.run(module.main, tmp_path)
    assert "## crafting" in first and "as-needed" in first and "SIMULATED" in first
    lines = (tmp_path / "results.jsonl").read_text().splitlines()
    assert len(lines) == 5 * 2 * 2
    assert anyio.run(module.main, tmp_path) == first  # resumed: nothing ran again
    assert len((tmp_path / "results.jsonl").read_text().splitlines()) == len(lines)


def test_public_bench_names_exist() -> None:
    import hierplan.bench

    for name in hierplan.bench.__all__:
        assert getattr(hierplan.bench, name) is not None


class _AnySuite:
    """The four suites' oracles as one: the first that knows the prompt answers."""

    def __init__(self) -> None:
        from hierplan.bench.suites import get_suite

        self.oracles = [get_suite(name).oracle() for name in SUITE_NAMES]

    def plan(self, prompt: Any) -> Any:
        return next((p for o in self.oracles if (p := o.plan(prompt)) is not None), None)

    def act(self, prompt: Any, done: Any) -> Any:
        return next((a for o in self.oracles if (a := o.act(prompt, done)) is not None), None)


@pytest.mark.parametrize("provider", ["openai", "anthropic"])
def test_the_same_command_runs_on_a_real_provider_adapter(
    provider: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Over the provider's wire format (a loopback server answering as the oracles would)."""
    from wire import MODELS, TEST_KEY, OracleBackend, WireServer

    monkeypatch.setenv(f"{provider.upper()}_API_KEY", TEST_KEY)
    out = tmp_path / provider
    with WireServer(OracleBackend(_AnySuite())) as server:
        result = bench("--suite", "all", "--strategies", "react,dag,as-needed", "--tasks", "1",
                       "--seeds", "1", "--model", MODELS[provider], "--base-url",
                       server.base_url(provider), "--sim-latency-scale", "0", "--no-plot",
                       "--yes", "--out", str(out))  # fmt: skip
        hits = server.count()
    assert result.exit_code == 0, result.output
    records = load_results(out / "results.jsonl")
    assert len(records) == (len(SUITE_NAMES) - 1) * 3 + 1  # planbench_oneshot: one strategy
    assert all(r["success"] for r in records), [r["verification"] for r in records]
    assert {r["model"] for r in records} == {MODELS[provider]}
    assert not any(r["simulated"] for r in records) and all(r["cost_usd"] > 0 for r in records)
    assert sum(r["model_calls"] for r in records) == hits
    summary = (out / "summary.md").read_text()
    assert "SIMULATED" not in summary and f"model {MODELS[provider]}" in summary


def test_a_missing_api_key_stops_before_anything_is_written(tmp_path: Path) -> None:
    out = tmp_path / "nothing"
    result = bench("--model", "openai:gpt-5-mini", "--out", str(out))
    assert result.exit_code == 2
    assert "OPENAI_API_KEY" in result.stderr
    assert not out.exists()
    result = bench("--base-url", "http://127.0.0.1:1/v1", "--out", str(out))
    assert result.exit_code == 2 and "apply to real models" in result.stderr


def test_a_missing_api_key_is_the_only_line_shown(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    result = bench("--model", "openai:gpt-5-mini", "--out", str(tmp_path / "nothing"))
    assert result.exit_code == 2
    assert result.stdout == ""  # no progress bar for a benchmark that never started
    assert result.stderr.startswith("error: openai:gpt-5-mini needs an API key")
    assert len(result.stderr.splitlines()) == 1, result.stderr


def test_a_resume_with_other_settings_names_each_one_that_differs(tmp_path: Path) -> None:
    out = tmp_path / "d"
    common = ["--suite", "game24", "--strategies", "react", "--tasks", "1", "--seeds", "1",
              "--no-plot", "--out", str(out)]  # fmt: skip
    assert bench(*common, "--sim-latency-scale", "0").exit_code == 0
    changed = ["--sim-latency-scale", "0.5", "--task-seed", "3", "--max-depth", "2"]
    changed += ["--set", "max_retries=1", "--sim-profile", "weak"]
    other = bench(*common, "--resume", *changed)
    assert other.exit_code == 2
    text = " ".join(other.stderr.split())
    assert text.startswith(f"error: cannot resume {out}: it was made with other settings (")
    for named in (
        "--sim-latency-scale: 0.0 then, 0.5 now",
        "--task-seed: 0 then, 3 now",
        "--max-depth: not given then, 2 now",
        '--set: not given then, {"max_retries": 1} now',
        '--sim-profile name: "typical" then, "weak" now',
    ):
        assert named in text, text
    assert "--model" not in text  # the same as recorded: not named
    assert text.endswith("use the same ones (and the same code) or another --out")


def _wide_summary(public: bool = True) -> Any:
    """The committed typical benchmark's summary; without the public sets, whose published
    figures are tables of long text that wrap by design."""
    root = Path(__file__).resolve().parent.parent
    records = load_results(root / "benchmarks" / "strategies" / "typical" / "results.jsonl")
    if not public:
        records = [
            r for r in records if r["suite"] not in ("planbench", "planbench_oneshot", "tot24")
        ]
    return summarize(records, "react")


def test_bench_tables_fit_an_80_column_terminal_and_keep_every_column_when_piped() -> None:
    import io

    from rich.console import Console

    from hierplan.bench.tables import TERMINAL_COLUMNS, print_tables

    def narrow(file: io.StringIO) -> Console:
        return Console(file=file, width=80, force_terminal=True, color_system=None)

    everything = io.StringIO()
    print_tables(_wide_summary(), narrow(everything))
    assert max(len(line) for line in everything.getvalue().splitlines()) <= 80
    assert "…" not in everything.getvalue()  # nothing cut short, published figures included
    summary = _wide_summary(public=False)
    # One line per row of every table: a row wrapped onto more lines would add lines.
    rows = len(summary.cells) + len({(r.suite, r.strategy) for r in summary.paired})
    terminal = io.StringIO()
    print_tables(summary, narrow(terminal))
    lines = terminal.getvalue().splitlines()
    assert max(len(line) for line in lines) <= 80
    assert "…" not in terminal.getvalue()
    assert sum(line.startswith("│") for line in lines) == rows
    joined = " ".join(" ".join(lines).split())
    assert "not shown at this width: tokens, calls, tools, replans, depth" in joined
    assert "tokens × (summary.md has every column)" in joined  # the paired table's last
    piped = io.StringIO()
    print_tables(summary, Console(file=piped, width=80))
    text = piped.getvalue()
    assert max(len(line) for line in text.splitlines()) > 80  # full width, not squeezed to 80
    assert "…" not in text and "not shown" not in text
    headers = next(line for line in text.splitlines() if "success [95% CI]" in line)
    assert all(header in headers for _, header, _ in TERMINAL_COLUMNS)
    assert sum(line.startswith("│") for line in text.splitlines()) == rows
