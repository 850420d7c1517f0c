"""``hierplan bench``: compare strategies on the benchmark suites.

Writes ``results.jsonl`` (one record per run), ``summary.md``, ``summary.csv``, ``paired.csv``
and ``cost_vs_success.png`` into ``--out``, and prints the tables. Exit status 0 when the
benchmark ran (whatever the success rates), 2 for bad arguments, with a one-line reason.
"""

from __future__ import annotations

import json
import shlex
import time
from collections.abc import Mapping
from pathlib import Path
from types import MappingProxyType
from typing import Annotated, Any, NoReturn

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

from hierplan.bench.harness import RESULTS, BenchConfig, check_config, parse_list, run_bench
from hierplan.bench.report import (
    ERRORED_NOTE,
    errored_runs,
    markdown,
    plot_cost_success,
    print_tables,
    summarize,
    unpriced_runs,
    write_csv,
)
from hierplan.bench.suites import SUITE_NAMES
from hierplan.cli.options import (
    BaseUrlOpt,
    LatencyOpt,
    McpOpt,
    ModelOpt,
    ProfileOpt,
    TimeoutOpt,
    ToolsOpt,
    out_option,
)
from hierplan.core.settings import STRATEGY_NAMES
from hierplan.errors import HierplanError, UserInputError
from hierplan.files import new_directory, write_atomic
from hierplan.runner.goals import settings_from_assignments
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


def fail(message: str) -> NoReturn:
    Console(stderr=True).print(f"error: {message}", markup=False, highlight=False, soft_wrap=True)
    raise typer.Exit(2)


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


SuiteOpt = Annotated[
    str,
    typer.Option("--suite", help=f"Suite(s), comma-separated or all: {', '.join(SUITE_NAMES)}."),
]
StrategiesOpt = Annotated[
    str,
    typer.Option("--strategies", help=f"Comma-separated or all: {', '.join(STRATEGY_NAMES)}."),
]
TasksOpt = Annotated[int, typer.Option("--tasks", help="Tasks per suite.")]
SeedsOpt = Annotated[int, typer.Option("--seeds", help="Seeds per task (simulator noise).")]
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


def bench_command(
    suite: SuiteOpt = "all",
    strategies: StrategiesOpt = "all",
    tasks: TasksOpt = 10,
    seeds: SeedsOpt = 3,
    model: ModelOpt = "sim",
    base_url: BaseUrlOpt = None,
    timeout: TimeoutOpt = None,
    concurrency: ConcurrencyOpt = 8,
    out: OutOpt = None,
    resume: ResumeOpt = False,
    baseline: BaselineOpt = "react",
    task_seed: TaskSeedOpt = 0,
    max_depth: MaxDepthOpt = None,
    set_: SetOpt = None,
    plot: PlotOpt = True,
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
    overrides = {k: v for k, v in locals().items() if k in NOISE_FLAGS}
    console = Console()
    try:
        config = BenchConfig(
            suites=parse_list(suite, SUITE_NAMES, "suites", "suite"),
            strategies=parse_list(strategies, STRATEGY_NAMES, "strategies", "strategy"),
            tasks=tasks,
            seeds=seeds,
            model=model,
            concurrency=concurrency,
            profile=noise_profile(sim_profile, overrides),
            latency_scale=sim_latency_scale,
            task_seed=task_seed,
            max_depth=max_depth,
            base_url=base_url,
            timeout_s=timeout,
            run_settings=settings_from_assignments(set_ or [], flags=SETTING_FLAGS),
            tools=entries_from_flags(tools or [], mcp or []),
        )
        check_config(config)
        if baseline not in STRATEGY_NAMES:
            raise UserInputError(
                f"unknown --baseline {baseline!r}: choose from {', '.join(STRATEGY_NAMES)}"
            )
    except HierplanError as exc:
        fail(str(exc))
    try:
        where = out or new_directory(
            Path("runs"), time.strftime("bench-%Y%m%d-%H%M%S"), "the benchmark"
        )
    except HierplanError as exc:
        fail(str(exc))
    records = _run(console, config, where, resume)
    command = _command(config, where, baseline, sim_profile, overrides)
    _notes(console, records, baseline, config)
    _report(
        console, records, where, baseline if baseline in config.strategies else None, command, plot
    )


def _notes(
    console: Console, records: list[dict[str, Any]], baseline: str, config: BenchConfig
) -> None:
    """What the tables cannot say: no baseline run, runs that raised, calls of no price."""
    if baseline not in config.strategies:
        _note(console, f"no paired differences: the baseline {baseline} was not among the "
              "strategies run (add it to --strategies, or choose another --baseline)")  # fmt: skip
    errored = errored_runs(records)
    if errored:
        _note(console, ERRORED_NOTE.format(f"{errored} of {len(records)}"))
    unpriced = unpriced_runs(records)
    if unpriced:
        _note(console, f"{unpriced} of {len(records)} runs made calls of no known price: their "
              "cost is unknown and left out of the cost figures")  # fmt: skip


def _note(console: Console, text: str) -> None:
    console.print(f"note: {text}", style="yellow", markup=False, highlight=False)


def _report(
    console: Console,
    records: list[dict[str, Any]],
    where: Path,
    baseline: str | None,
    command: str,
    plot: bool,
) -> None:
    """Print the tables and write summary.md, the CSV files and the plot."""
    summary = summarize(records, baseline)
    print_tables(summary, console)
    write_atomic(where / "summary.md", markdown(summary, command))
    write_csv(summary, where / "summary.csv", where / "paired.csv")
    written = [RESULTS, "summary.md", "summary.csv", "paired.csv"]
    if plot:
        try:
            plot_cost_success(summary, where / "cost_vs_success.png")
            written.append("cost_vs_success.png")
        except UserInputError as exc:
            _note(console, str(exc))
    console.print(f"wrote {', '.join(written)} to {where}", highlight=False)


def _run(console: Console, config: BenchConfig, out: Path, resume: bool) -> list[dict[str, Any]]:
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
            lambda: run_bench(config, out, resume=resume, on_start=started, on_result=finished)
        )
    except HierplanError as exc:
        problem = str(exc)
    finally:
        if shown:
            progress.stop()
    fail(problem)


def _command(
    config: BenchConfig, out: Path, baseline: str, profile: str, overrides: dict[str, Any]
) -> str:
    """The command that reproduces this benchmark."""
    parts = [
        "hierplan",
        "bench",
        "--suite",
        ",".join(config.suites),
        "--strategies",
        ",".join(config.strategies),
        "--tasks",
        str(config.tasks),
        "--seeds",
        str(config.seeds),
        "--model",
        config.model,
        "--concurrency",
        str(config.concurrency),
        "--out",
        str(out),
    ]
    if baseline != "react":
        parts += ["--baseline", baseline]
    if config.task_seed:
        parts += ["--task-seed", str(config.task_seed)]
    if config.max_depth:
        parts += ["--max-depth", str(config.max_depth)]
    for key, value in config.run_settings.items():
        parts += ["--set", f"{key}={_setting_text(value)}"]
    for entry in config.tools:  # as given: a python entry by --tools, a server by --mcp
        python = entry.python
        parts += ["--tools", python] if python else ["--mcp", json.dumps(entry.saved()["mcp"])]
    if config.base_url:
        parts += ["--base-url", config.base_url]
    if config.timeout_s:
        parts += ["--timeout", _exact(config.timeout_s)]
    if config.simulated:
        parts += ["--sim-profile", profile, "--sim-latency-scale", _exact(config.latency_scale)]
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
