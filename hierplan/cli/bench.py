"""``hierplan bench``: compare strategies on the benchmark suites.

Writes ``results.jsonl`` (one record per run), ``summary.md``, ``summary.csv``, ``paired.csv``
and ``cost_vs_success.png`` into ``--out`` (and each run's ``run.json`` with ``--save-runs``),
and prints the tables. On a real model it first prints the estimated cost and asks (or, not at
a terminal, refuses without ``--yes``). Exit status 0 when the benchmark ran (whatever the
success rates), 1 when its estimated cost was declined, 2 for bad arguments, with a one-line
reason.
"""

from __future__ import annotations

import json
import shlex
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Annotated, Any

import anyio
import typer
from pydantic import ValidationError
from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)

from hierplan.bench.estimate import estimate_cost, usd_text
from hierplan.bench.harness import BenchConfig, BenchRun, check_config, parse_list, run_bench
from hierplan.bench.outdir import RESULTS, load_results
from hierplan.bench.plot import plot_cost_success
from hierplan.bench.records import latest_records, model_price
from hierplan.bench.report import (
    CPU_ONLY_NOTE,
    ERRORED_NOTE,
    errored_runs,
    not_started_runs,
    summarize,
    unpriced_runs,
    write_csv,
)
from hierplan.bench.suites import get_suite, installed_suites, suite_names
from hierplan.bench.tables import markdown, print_tables
from hierplan.budgets.instrument import unknown_price_message
from hierplan.cli.bench_budget import BenchBudget
from hierplan.cli.options import (
    BaseUrlOpt,
    LatencyOpt,
    McpOpt,
    ModelOpt,
    PriceInOpt,
    PriceOutOpt,
    ProfileOpt,
    TimeoutOpt,
    ToolsOpt,
    _usd_amount,
    fail,
    out_option,
)
from hierplan.core.settings import STRATEGY_NAMES, registered_strategies, strategy_names
from hierplan.errors import HierplanError, UserInputError
from hierplan.files import new_directory, write_atomic
from hierplan.pricing import PriceTable
from hierplan.runner.goals import settings_from_assignments
from hierplan.runner.models import priced_as_of, with_price
from hierplan.simulator.profiles import NoiseProfile, get_profile
from hierplan.tools.config import entries_from_flags

# CLI flag -> NoiseProfile field, for the explicit simulator parameters.
NOISE_FLAGS: Mapping[str, str] = MappingProxyType(
    {
        "sim_plan_error_rate": "plan_error_rate",
        "sim_plan_error_per_step": "plan_error_per_step",
        "sim_executor_error_rate": "executor_error_rate",
        "sim_executor_error_per_action": "executor_error_per_action",
        "sim_executor_error_after_error": "executor_error_after_error",
        "sim_max_error_rate": "max_error_rate",
        "sim_give_up_share": "give_up_share",
        "sim_max_calls_per_turn": "max_calls_per_turn",
        "sim_latency_median": "latency_median_s",
        "sim_latency_sigma": "latency_sigma",
        "sim_latency_per_token": "latency_per_output_token_s",
        "sim_verbosity": "verbosity",
    }
)


def _noise_option(flag: str) -> Any:
    """A ``--sim-...`` option whose help is the profile field's description."""
    field = NoiseProfile.model_fields[NOISE_FLAGS[flag]]
    return typer.Option(help=f"{field.description} Overrides the profile.")


def noise_profile(name: str, overrides: dict[str, Any]) -> NoiseProfile:
    """The named profile with explicit parameters applied (a clear error if one is invalid)."""
    base = get_profile(name)
    given = {NOISE_FLAGS[k]: v for k, v in overrides.items() if v is not None}
    if not given:
        return base
    try:
        return NoiseProfile.model_validate({**base.model_dump(), **given, "name": f"{name}*"})
    except ValidationError as exc:
        first = exc.errors()[0]
        field = str(first["loc"][0]) if first["loc"] else "profile"
        flag = next((k for k, v in NOISE_FLAGS.items() if v == field), field)
        raise UserInputError(
            f"--{flag.replace('_', '-')}: {first['msg']} (got {first.get('input')!r})"
        ) from None


def parse_tasks(text: str) -> int | None:
    """``--tasks``: a number, or ``all`` (every task of a public set: ``None``)."""
    if text.strip().lower() == "all":
        return None
    try:
        return int(text)
    except ValueError:
        raise UserInputError(f"--tasks must be a number or all (got {text!r})") from None


SuiteOpt = Annotated[
    str,
    typer.Option("--suite", help="Suite(s), comma-separated or all (hierplan bench --list)."),
]
StrategiesOpt = Annotated[
    str,
    typer.Option("--strategies", help="Strategies, comma-separated or all (see --list)."),
]
TasksOpt = Annotated[
    str,
    typer.Option("--tasks", metavar="N|all", help="Tasks per suite (all: a public set's all)."),
]
SeedsOpt = Annotated[int, typer.Option("--seeds", help="Seeds per task (simulator noise).")]
SplitOpt = Annotated[
    str | None,
    typer.Option("--split", help="Split of the suites with splits: tot24 test (default) or all."),
]
ConcurrencyOpt = Annotated[int, typer.Option("--concurrency", "-c", help="Runs at once.")]
OutOpt = Annotated[Path | None, out_option("Output directory (default runs/bench-<time>).")]
ResumeOpt = Annotated[
    bool, typer.Option("--resume", help="Continue the benchmark already in --out.")
]
BaselineOpt = Annotated[
    str, typer.Option("--baseline", help="Strategy the paired differences compare against.")
]
TaskSeedOpt = Annotated[int, typer.Option("--task-seed", help="Seed of the task generator.")]
MaxDepthOpt = Annotated[
    int | None,
    typer.Option("--max-depth", min=1, max=10, help="Deepest plan level (default 3)."),
]
PlotOpt = Annotated[
    bool, typer.Option("--plot/--no-plot", help="Write cost_vs_success.png (needs matplotlib).")
]
SaveRunsOpt = Annotated[
    bool, typer.Option("--save-runs", help="Keep each run's run.json under --out/runs/.")
]
GaveUpOpt = Annotated[
    bool,
    typer.Option(
        "--count-gave-up", help="Count runs that gave up with the goal reached as successes."
    ),
]
ListOpt = Annotated[
    bool, typer.Option("--list", help="List the installed suites and strategies, and exit.")
]
YesOpt = Annotated[
    bool, typer.Option("--yes", "-y", help="Start a bench on a real model without asking.")
]
BudgetUsdOpt = Annotated[
    float | None,
    typer.Option("--budget-usd", callback=_usd_amount, help="Cap the whole bench's cost in USD."),
]
SetOpt = Annotated[
    list[str] | None,
    typer.Option(
        "--set",
        metavar="KEY=VALUE",
        help="A run setting of every run, e.g. max_retries=0 (repeatable).",
    ),
]
# The run settings the benchmark sets itself, by strategy and seed, or by a flag of its own.
SETTING_FLAGS: Mapping[str, str] = MappingProxyType(
    {"strategy": "--strategies", "seed": "--seeds", "max_depth": "--max-depth"}
)


@dataclass(slots=True, frozen=True)
class Choices:
    """What the command line asked beyond the benchmark's config: how to report it, how to
    make it safe, and what reproduces it."""

    baseline: str
    plot: bool
    count_gave_up: bool
    yes: bool
    budget_usd: float | None
    command: str


def bench_command(
    suite: SuiteOpt = "all",
    strategies: StrategiesOpt = "all",
    tasks: TasksOpt = "10",
    seeds: SeedsOpt = 3,
    split: SplitOpt = None,
    model: ModelOpt = "sim",
    base_url: BaseUrlOpt = None,
    timeout: TimeoutOpt = None,
    price_in: PriceInOpt = None,
    price_out: PriceOutOpt = None,
    concurrency: ConcurrencyOpt = 8,
    out: OutOpt = None,
    resume: ResumeOpt = False,
    baseline: BaselineOpt = "react",
    task_seed: TaskSeedOpt = 0,
    max_depth: MaxDepthOpt = None,
    set_: SetOpt = None,
    plot: PlotOpt = True,
    save_runs: SaveRunsOpt = False,
    count_gave_up: GaveUpOpt = False,
    yes: YesOpt = False,
    budget_usd: BudgetUsdOpt = None,
    list_: ListOpt = False,
    sim_profile: ProfileOpt = "typical",
    sim_latency_scale: LatencyOpt = 1.0,
    sim_plan_error_rate: Annotated[float | None, _noise_option("sim_plan_error_rate")] = None,
    sim_plan_error_per_step: Annotated[
        float | None, _noise_option("sim_plan_error_per_step")
    ] = None,
    sim_executor_error_rate: Annotated[
        float | None, _noise_option("sim_executor_error_rate")
    ] = None,
    sim_executor_error_per_action: Annotated[
        float | None, _noise_option("sim_executor_error_per_action")
    ] = None,
    sim_executor_error_after_error: Annotated[
        float | None, _noise_option("sim_executor_error_after_error")
    ] = None,
    sim_max_error_rate: Annotated[float | None, _noise_option("sim_max_error_rate")] = None,
    sim_give_up_share: Annotated[float | None, _noise_option("sim_give_up_share")] = None,
    sim_max_calls_per_turn: Annotated[int | None, _noise_option("sim_max_calls_per_turn")] = None,
    sim_latency_median: Annotated[float | None, _noise_option("sim_latency_median")] = None,
    sim_latency_sigma: Annotated[float | None, _noise_option("sim_latency_sigma")] = None,
    sim_latency_per_token: Annotated[float | None, _noise_option("sim_latency_per_token")] = None,
    sim_verbosity: Annotated[float | None, _noise_option("sim_verbosity")] = None,
    tools: ToolsOpt = None,
    mcp: McpOpt = None,
) -> None:
    """Compare strategies on the benchmark suites: same tasks, tools and model for each."""
    given = dict(locals())
    console = Console()
    if list_:
        list_installed(console)
        return
    overrides = {k: v for k, v in given.items() if k in NOISE_FLAGS}
    try:
        config = _config(given, overrides)
        if baseline not in strategy_names():
            raise UserInputError(
                f"unknown --baseline {baseline!r}: choose from {', '.join(strategy_names())}"
            )
        _check_budget(config, budget_usd)
        where = out or new_directory(
            Path("runs"), time.strftime("bench-%Y%m%d-%H%M%S"), "the benchmark"
        )
    except HierplanError as exc:
        fail(str(exc))
    command = _command(config, where, given, overrides)
    choices = Choices(baseline, plot, count_gave_up, yes, budget_usd, command)
    records = _run(console, config, where, resume, choices)
    shown = baseline if baseline in config.strategies else None
    report(console, records, where, config, shown, choices)


def _config(given: Mapping[str, Any], overrides: dict[str, Any]) -> BenchConfig:
    """The benchmark's config from the command line's values, checked."""
    config = BenchConfig(
        suites=parse_list(given["suite"], suite_names(), "suites", "suite"),
        strategies=parse_list(given["strategies"], strategy_names(), "strategies", "strategy"),
        tasks=parse_tasks(given["tasks"]),
        seeds=given["seeds"],
        model=given["model"],
        concurrency=given["concurrency"],
        profile=noise_profile(given["sim_profile"], overrides),
        latency_scale=given["sim_latency_scale"],
        task_seed=given["task_seed"],
        max_depth=given["max_depth"],
        base_url=given["base_url"],
        timeout_s=given["timeout"],
        run_settings=settings_from_assignments(given["set_"] or [], flags=SETTING_FLAGS),
        split=given["split"],
        price_in=given["price_in"],
        price_out=given["price_out"],
        save_runs=given["save_runs"],
        tools=entries_from_flags(given["tools"] or [], given["mcp"] or []),
    )
    check_config(config)
    return config


def _check_budget(config: BenchConfig, budget_usd: float | None) -> None:
    """A USD budget needs the model's price (a budget fails closed)."""
    if budget_usd is not None and model_price(config.model, config)["price_in_per_mtok"] is None:
        raise UserInputError(unknown_price_message(priced_as_of(config.model)))


def can_ask() -> bool:
    """Whether a person can answer a question here (standard input is a terminal)."""
    return sys.stdin.isatty()


def _confirmation(console: Console, config: BenchConfig, choices: Choices) -> Any:
    """The benchmark's ``confirm``: on a real model, the estimated cost, then a question (or,
    where nobody can answer, a refusal without ``--yes``)."""

    async def confirm(runs: Sequence[BenchRun]) -> None:
        if config.simulated or not runs:
            return
        estimate = await estimate_cost(config, runs)
        for line in estimate.lines():
            console.print(line, markup=False, highlight=False)
        if choices.budget_usd is not None:
            console.print(f"Budget: ${choices.budget_usd:g} for the whole bench (--budget-usd).")
        if choices.yes:
            return
        total = "an unknown cost" if estimate.usd is None else f"about {usd_text(estimate.usd)}"
        if not can_ask():
            raise UserInputError(
                f"this bench on {config.model} would cost {total}: pass --yes to start it "
                "(and --budget-usd to cap it)"
            )
        if not typer.confirm("Start it?", default=False):
            console.print("not started", highlight=False)
            raise typer.Exit(1)

    return confirm


def _gate(config: BenchConfig, out: Path, resume: bool, budget_usd: float | None) -> Any:
    """The whole bench's budget, when ``--budget-usd`` is given (what a resumed benchmark's
    runs already spent counts against it)."""
    if budget_usd is None:
        return None
    spent = 0.0
    if resume and (out / RESULTS).exists():
        previous = latest_records(load_results(out / RESULTS))
        spent = sum(float(r.get("cost_usd") or 0.0) for r in previous)
    priced = priced_as_of(config.model)
    return BenchBudget(
        budget_usd,
        concurrency=config.concurrency,
        model=config.model,
        pricing=with_price(PriceTable(), config.price_in, config.price_out, [priced]),
        spent_usd=spent,
    )


def _run(
    console: Console, config: BenchConfig, out: Path, resume: bool, choices: Choices
) -> list[dict[str, Any]]:
    try:
        gate = _gate(config, out, resume, choices.budget_usd)
    except HierplanError as exc:
        fail(str(exc))
    confirm = _confirmation(console, config, choices)
    label = "SIMULATED " if config.simulated else ""
    progress = Progress(
        TextColumn(f"[bold]{label}bench"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[ok]} succeeded"),
        TimeElapsedColumn(),
        TimeRemainingColumn(),
        console=console,
        transient=False,
    )
    bar = progress.add_task("runs", total=None, ok=0)
    succeeded = 0
    shown: list[bool] = []

    def started(total: int, already: int) -> None:
        # Shown once the runs are about to start: a benchmark refused before (a missing API
        # key, an --out holding another benchmark) shows its one-line error alone.
        progress.start()
        shown.append(True)
        progress.update(bar, total=total, completed=already)

    def finished(record: dict[str, Any]) -> None:
        nonlocal succeeded
        succeeded += bool(record.get("success"))
        progress.update(bar, advance=1, ok=succeeded)

    try:
        return anyio.run(
            lambda: run_bench(
                config, out, resume=resume, on_start=started, on_result=finished,
                confirm=confirm, gate=gate,
            )
        )  # fmt: skip
    except HierplanError as exc:
        problem = str(exc)
    finally:
        if shown:
            progress.stop()
    fail(problem)


def list_installed(console: Console) -> None:
    """``--list``: every installed suite and strategy, and where each comes from."""
    console.print("Suites (--suite):", highlight=False)
    for found in installed_suites():
        console.print(
            f"  {found.name}  [{found.origin}]  {found.description}",
            markup=False,
            highlight=False,
            soft_wrap=True,
        )
    console.print("Strategies (--strategies):", highlight=False)
    for name in STRATEGY_NAMES:
        console.print(f"  {name}  [hierplan]", markup=False, highlight=False)
    for name, ep in sorted(registered_strategies().items()):
        origin = f"{ep.dist.name} {ep.dist.version}" if ep.dist is not None else ep.value
        console.print(f"  {name}  [{origin}]", markup=False, highlight=False)


def _note(console: Console, text: str) -> None:
    console.print(f"note: {text}", style="yellow", markup=False, highlight=False)


def _notes(
    console: Console, records: list[dict[str, Any]], config: BenchConfig, choices: Choices
) -> None:
    """What the tables cannot say: no baseline run, runs that raised or did not start, calls of
    no price, latencies that are CPU time only, suites run under their fixed strategy."""
    if choices.baseline not in config.strategies:
        _note(
            console,
            f"no paired differences: the baseline {choices.baseline} was not among the "
            "strategies run (add it to --strategies, or choose another --baseline)",
        )
    for name in config.suites:
        fixed = get_suite(name).fixed_strategy
        if fixed is not None:
            _note(console, f"{name} is a fixed setting: it runs under {fixed} only")
    errored = errored_runs(records)
    if errored:
        _note(console, ERRORED_NOTE.format(f"{errored} of {len(records)}"))
    skipped = not_started_runs(records)
    if skipped:
        _note(console, f"{skipped} runs could not start within --budget-usd: they are in no "
              "figure; --resume with a larger budget runs them")  # fmt: skip
    unpriced = unpriced_runs(records)
    if unpriced:
        _note(console, f"{unpriced} of {len(records)} runs made calls of no known price: their "
              "cost is unknown and left out of the cost figures")  # fmt: skip
    if config.simulated and config.latency_scale == 0:
        _note(console, CPU_ONLY_NOTE)


def report(
    console: Console,
    records: list[dict[str, Any]],
    where: Path,
    config: BenchConfig,
    baseline: str | None,
    choices: Choices,
) -> None:
    """Print the notes and tables; write summary.md, the CSV files and the plot."""
    _notes(console, records, config, choices)
    try:
        summary = summarize(records, baseline, count_gave_up=choices.count_gave_up)
    except HierplanError as exc:
        fail(str(exc))
    print_tables(summary, console)
    write_atomic(where / "summary.md", markdown(summary, choices.command))
    write_csv(summary, where / "summary.csv", where / "paired.csv")
    written = [RESULTS, "summary.md", "summary.csv", "paired.csv"]
    if config.save_runs:
        written.append("runs/")
    if choices.plot:
        try:
            plot_cost_success(summary, where / "cost_vs_success.png")
            written.append("cost_vs_success.png")
        except UserInputError as exc:
            _note(console, str(exc))
    console.print(f"wrote {', '.join(written)} to {where}", highlight=False)


def _command(
    config: BenchConfig, out: Path, given: Mapping[str, Any], overrides: dict[str, Any]
) -> str:
    """The command that reproduces this benchmark (without ``--yes``: a paid rerun asks)."""
    parts = ["hierplan", "bench", "--suite", ",".join(config.suites), "--strategies",
             ",".join(config.strategies), "--tasks",
             "all" if config.tasks is None else str(config.tasks), "--seeds", str(config.seeds),
             "--model", config.model, "--concurrency", str(config.concurrency),
             "--out", str(out)]  # fmt: skip
    if given["baseline"] != "react":
        parts += ["--baseline", given["baseline"]]
    if config.split:
        parts += ["--split", config.split]
    if config.task_seed:
        parts += ["--task-seed", str(config.task_seed)]
    if config.max_depth:
        parts += ["--max-depth", str(config.max_depth)]
    for key, value in config.run_settings.items():
        parts += ["--set", f"{key}={_setting_text(value)}"]
    for entry in config.tools:  # as given: a python entry by --tools, a server by --mcp
        python = entry.python
        parts += ["--tools", python] if python else ["--mcp", json.dumps(entry.saved()["mcp"])]
    for flag, value in (("--base-url", config.base_url), ("--timeout", config.timeout_s),
                        ("--price-in", config.price_in), ("--price-out", config.price_out),
                        ("--budget-usd", given["budget_usd"])):  # fmt: skip
        if value is not None:
            parts += [flag, value if isinstance(value, str) else _exact(value)]
    parts += [f for f, on in (("--save-runs", config.save_runs),
                              ("--count-gave-up", given["count_gave_up"])) if on]  # fmt: skip
    if config.simulated:
        parts += ["--sim-profile", given["sim_profile"], "--sim-latency-scale",
                  _exact(config.latency_scale)]  # fmt: skip
        for flag, value in overrides.items():
            if value is not None:
                parts += [f"--{flag.replace('_', '-')}", _exact(value)]
    return shlex.join(parts)


def _setting_text(value: Any) -> str:
    """A ``--set`` value as YAML reads it back the same (``null``, a number, a word)."""
    if value is None:
        return "null"
    if isinstance(value, float):
        return _exact(value)
    return str(value)


def _exact(value: float) -> str:
    """``value`` as short as it reads back the same: the command must give the same settings,
    or ``--resume`` with it finds a benchmark "made with other settings"."""
    short = f"{value:g}"
    return short if float(short) == value else repr(value)
