"""The ``hierplan`` command: run, demo, resume, view, validate, scenarios, bench.

Exit status: 0 when the run succeeded (and its verification, if any, passed); 1 when it failed,
was partial or rejected; 2 for bad input, always with a one-line reason and no traceback; 3 when
the run paused for a plan review (continue it with ``hierplan resume``); 130 when interrupted
(Ctrl-C), 143 when stopped by SIGTERM (both leave the run's record, as a shell reports them).
"""

from __future__ import annotations

import json
import math
import shlex
import signal
import sys
import time
from collections.abc import Awaitable, Callable, Iterator, Mapping
from contextlib import ExitStack, contextmanager, suppress
from functools import partial
from pathlib import Path
from types import MappingProxyType
from typing import Annotated, Any, NoReturn, cast

import anyio
import typer
from anyio.abc import TaskStatus
from rich.console import Console

from hierplan import __version__
from hierplan.budgets.budget import MAX_BUDGET_TOKENS
from hierplan.cli.batch import register as register_batch_commands
from hierplan.cli.bench import bench_command
from hierplan.cli.options import BaseUrlOpt, PriceInOpt, PriceOutOpt, TimeoutOpt, out_option
from hierplan.cli.review import (
    EXIT_PAUSED,
    PauseOpt,
    PolicyOpt,
    ReviewOpt,
    ReviewSetup,
    print_paused,
    resume_decision,
    review_setup,
    saved_mode,
)
from hierplan.core.instrument import Instrument
from hierplan.core.settings import MAX_RETRIES, MAX_SEED, STRATEGY_NAMES, RunSettings
from hierplan.core.views import RunView
from hierplan.durable.lock import holding_run_directory
from hierplan.errors import HierplanError, UserInputError
from hierplan.files import new_directory
from hierplan.hierarchy.context import RunContext
from hierplan.hierarchy.pause import CHECKPOINT_FILE, RESUMING_FILE, load_checkpoint
from hierplan.models.base import parse_model_string
from hierplan.models.provider import one_line
from hierplan.plans.plan import DEFAULT_MAX_DEPTH, DEFAULT_MAX_STEPS, load_plan, validate_plan
from hierplan.pricing import PriceTable
from hierplan.records import RunResult
from hierplan.review.console import editor_open, reviewer_name
from hierplan.review.policy import POLICY_HELP
from hierplan.runner.goals import load_goal_file, settings_from_assignments
from hierplan.runner.handle import start as start_run
from hierplan.runner.models import SIMULATOR_ONLY, is_simulated, provider_options
from hierplan.runner.resume import drop_used_checkpoint
from hierplan.runner.resume import resume as resume_run
from hierplan.scenarios import scenarios
from hierplan.simulator.profiles import PROFILES
from hierplan.tracing.setup import (
    TRACE_HELP,
    configure_tracing,
    export_problems_in_one_line,
    parse_trace_target,
)
from hierplan.view.console import RunConsole
from hierplan.view.html import write_html
from hierplan.view.tree import plan_tree, print_run, render_run

app = typer.Typer(
    name="hierplan",
    help="Hierarchical planner-executor agents: inspectable plans, exact budgets, traced trees.",
    add_completion=False,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    # Click's plain help: rich's boxed table drops the metavar of flags into a "<bool>" column
    # and, at 80 columns, cuts option help short with an ellipsis.
    rich_markup_mode=None,
)


def _print_version(value: bool) -> None:
    if value:
        typer.echo(f"hierplan {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: Annotated[
        bool,
        typer.Option(
            "--version",
            callback=_print_version,
            is_eager=True,
            help="Print hierplan's version and exit.",
        ),
    ] = False,
) -> None:
    """Hierarchical planner-executor agents: inspectable plans, exact budgets, traced trees."""


DEMO_OUT = Path("runs/demo")
# The scenario the demo runs; a run.json of any other run is not the demo's to replace.
DEMO_SCENARIO = "data_migration"
# The typical profile models a hosted model's speed (10 ms per output token); the demo runs it at a
# quarter of that so a first look takes seconds, not a minute. --sim-latency-scale 1 restores it.
DEMO_LATENCY_SCALE = 0.25

StrategyOpt = Annotated[
    str, typer.Option("--strategy", "-s", help=f"One of: {', '.join(STRATEGY_NAMES)}.")
]
SeedOpt = Annotated[
    int,
    typer.Option(
        "--seed", min=0, max=MAX_SEED, help="Seed of the simulator (runs are reproducible)."
    ),
]
ProfileOpt = Annotated[
    str, typer.Option("--sim-profile", help=f"Simulator noise: {', '.join(PROFILES)}.")
]
LatencyOpt = Annotated[
    float, typer.Option("--sim-latency-scale", min=0.0, help="Scale simulated latency (0 = none).")
]
TraceOpt = Annotated[list[str] | None, typer.Option("--trace", metavar="TARGET", help=TRACE_HELP)]
TraceContentOpt = Annotated[
    bool,
    typer.Option(
        "--trace-content", help="Record prompts and completions in the trace (off by default)."
    ),
]
YesOpt = Annotated[bool, typer.Option("--yes", "-y", help="Approve every plan without asking.")]

# The options of `hierplan run` alone.
GoalArg = Annotated[str | None, typer.Argument(help="The goal, as free text (needs a real model).")]
ScenarioOpt = Annotated[str | None, typer.Option("--scenario", help="Run a built-in scenario.")]
GoalFileOpt = Annotated[Path | None, typer.Option("--goal-file", help="A YAML/JSON goal file.")]
ModelOpt = Annotated[
    str,
    typer.Option(
        "--model", "-m", help="sim, sim:<priced-as model>, openai:<model> or anthropic:<model>."
    ),
]
MaxDepthOpt = Annotated[int, typer.Option("--max-depth", min=1, max=10, help="Deepest plan level.")]
ConcurrencyOpt = Annotated[
    int, typer.Option("--concurrency", "-c", min=1, help="Executor steps at once.")
]
RunOutOpt = Annotated[Path | None, out_option("Run directory (default runs/<time>).")]
OverwriteOpt = Annotated[
    bool,
    typer.Option(
        "--overwrite",
        help="Replace an earlier run's record and scenario files in --out (refused otherwise).",
    ),
]
ModelRetriesOpt = Annotated[
    int | None,
    typer.Option(
        "--model-retries", min=0, max=MAX_RETRIES, help="Retries of a failed model call (3)."
    ),
]
SetOpt = Annotated[
    list[str] | None,
    typer.Option(
        "--set",
        metavar="KEY=VALUE",
        help="A run setting without a flag of its own, e.g. executor_max_tokens=4096 (repeatable).",
    ),
]
# The run settings with a flag of their own: --set refuses them, so each has one place.
SETTING_FLAGS: Mapping[str, str] = MappingProxyType(
    {
        "strategy": "--strategy",
        "max_depth": "--max-depth",
        "concurrency": "--concurrency",
        "seed": "--seed",
        "model_retries": "--model-retries",
    }
)


def _usd_amount(value: float | None) -> float | None:
    """A ``--budget-usd`` as given, refused unless it is a number of USD, 0 or more: a range
    check alone lets ``nan`` by, or refuses it saying it is below 0."""
    if value is not None and not (math.isfinite(value) and value >= 0):
        raise typer.BadParameter(f"give a number of USD, 0 or more (e.g. 0.5), not {value:g}")
    return value


BudgetUsdOpt = Annotated[
    float | None,
    typer.Option("--budget-usd", callback=_usd_amount, help="Cap the run's cost in USD (exact)."),
]
BudgetTokensOpt = Annotated[
    int | None,
    typer.Option(
        "--budget-tokens",
        min=0,
        max=MAX_BUDGET_TOKENS,
        help="Cap the run's tokens (input + output).",
    ),
]
AllocationOpt = Annotated[
    str,
    typer.Option(
        "--allocation", help="Split a budget among sub-goals: equal, weighted or on-demand."
    ),
]


def _fail(message: str, code: int = 2) -> NoReturn:
    Console(stderr=True).print(f"error: {message}", markup=False, highlight=False, soft_wrap=True)
    raise typer.Exit(code)


def _unpriced_simulation(model: str, priced: bool) -> str | None:
    """A warning when ``model`` is a simulated model priced as one the price table does not
    know (``sim:my-model`` without ``--price-in``/``--price-out``): its calls have no cost, where
    the user likely meant a real model's. ``None`` when there is nothing to say."""
    parsed = parse_model_string(model)
    if parsed.provider != "sim" or not parsed.name or priced:
        return None
    table = PriceTable()
    if table.lookup(parsed.name) is not None:
        return None
    return (
        f"{model} is simulated as {parsed.name!r}, which has no known price, so its calls have "
        f"no cost; give --price-in/--price-out, or simulate a priced model: "
        + ", ".join(f"sim:{name}" for name in table.models())
    )


@contextmanager
def _holding(run_dir: Path, *, otherwise: str) -> Iterator[None]:
    """Hold ``run_dir``'s lock (:mod:`hierplan.durable.lock`) for the body, or refuse: two processes
    writing one run directory would mix their records, checkpoints and scenario files.
    ``otherwise`` says what the refused command can do instead of waiting. The run the body
    starts there sees that it is held (and does not refuse itself); the body goes on writing
    the directory (run.json) after the run returns, with the lock still held."""
    with ExitStack() as held:
        try:
            held.enter_context(holding_run_directory(run_dir, otherwise=otherwise))
        except HierplanError as exc:
            _fail(str(exc))
        yield


def _refuse_paused_run(run_dir: Path, *, start_over: str = "") -> None:
    """Refuse a new run in a directory that holds a paused one: the new run would drop the
    paused run's checkpoint and the decisions waiting in its pending/ folder. ``start_over``
    ends the way to start over there (e.g. the flag that lets the new run replace the old)."""
    if not (run_dir / CHECKPOINT_FILE).exists():
        return
    where = shlex.quote(str(run_dir))
    _fail(
        f"{run_dir} holds a paused run waiting for a decision: continue it with hierplan resume "
        f"{where} (its pending/ folder says how), or give this run another --out; to start over "
        f"in {run_dir}, delete {run_dir / CHECKPOINT_FILE} first{start_over}"
    )


Start = Callable[..., Awaitable[RunResult]]
EXIT_INTERRUPTED = 130
EXIT_TERMINATED = 143  # 128 + SIGTERM, as a shell reports a process that SIGTERM ended
# Where a run without --out writes: a new directory named by the time it starts.
RUNS_DIR = Path("runs")

# The signals that stop a run the way Ctrl-C does: a service manager or `kill` sends SIGTERM.
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


class StopSignal:
    """Which signal stopped a command's run, if one did: Ctrl-C (SIGINT) or SIGTERM."""

    __slots__ = ("signum",)

    def __init__(self) -> None:
        self.signum: int | None = None

    def exit_code(self) -> int:
        """130 after Ctrl-C, 143 after SIGTERM."""
        return EXIT_TERMINATED if self.signum == signal.SIGTERM else EXIT_INTERRUPTED

    def reason(self) -> str:
        """What stopped the run, in words: ``interrupted (Ctrl-C)`` or ``stopped by SIGTERM``."""
        return "stopped by SIGTERM" if self.signum == signal.SIGTERM else "interrupted (Ctrl-C)"


def _refuse_earlier_run(run_dir: Path, scenario: str | None) -> None:
    """Refuse a run in a directory that holds an earlier run's record, or files its scenario's
    setup would delete: they would be lost without a word."""
    earlier = [run_dir / "run.json"] if (run_dir / "run.json").is_file() else []
    found = scenarios().get(scenario) if scenario is not None else None
    if found is not None:  # an unknown one is refused by the run, saying which are known
        earlier += found.replaced_files(run_dir)
    if earlier:
        names = ", ".join(path.name for path in earlier)
        _fail(
            f"{run_dir} holds an earlier run ({names}) that this run would replace: give "
            "--overwrite to replace it, or give this run another --out"
        )


def _refuse_other_record(run_dir: Path) -> None:
    """Refuse a demo in a directory whose ``run.json`` is not a data-migration run's record
    (a ``hierplan run`` of another goal, or no record at all): the demo replaces only its
    own kind of output."""
    path = run_dir / "run.json"
    if not path.is_file():
        return
    try:
        record = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, ValueError):
        record = None
    if isinstance(record, dict) and record.get("scenario") == DEMO_SCENARIO:
        return
    _fail(
        f"{path} is not the record of a demo (or another data-migration run), and the demo "
        "would replace it: give the demo another --out, or move that file away"
    )


def _exit_code(result: RunResult, stop: StopSignal) -> int:
    if result.status == "cancelled":  # only a stop signal cancels a run started here
        return stop.exit_code()
    verified = result.verification is None or bool(result.verification.get("ok"))
    return 0 if result.status == "succeeded" and verified else 1


def _finish(
    console: Console,
    result: RunResult,
    out: Path,
    started: float,
    stop: StopSignal,
    resumed: bool = False,
) -> NoReturn:
    """Save and show the run's record, and exit with its status. After a resume (``resumed``)
    the checkpoint it used is dropped once the record is saved, unless the run was cancelled:
    kept, it lets the user go on from the pause anyway."""
    # What hierplan resume says about a checkpoint left by a resume that did not finish.
    kept = (
        f"; the checkpoint it resumed from is kept ({RESUMING_FILE}): hierplan resume "
        f"{shlex.quote(str(out))} says how to go on"
        if resumed
        else ""
    )
    try:
        path: Path | None = result.write(out / "run.json")
    except (OSError, HierplanError) as exc:
        # The run is over whatever happens to its record: show it before saying so.
        path, unsaved = None, str(exc) if isinstance(exc, HierplanError) else exc.strerror
    console.print()
    print_run(result, console)
    # After a resume, the time of this command only: run.json and the HTML report count the
    # whole run, from its first start (the pause included).
    stats = [
        f"wall time{' of this resume' if resumed else ''} {time.monotonic() - started:.1f} s",
        f"peak leaves running at once {result.stats.get('peak_concurrent_leaves', 0)}",
    ]
    details = (result.verification or {}).get("details", {})
    if "rows_per_second" in details:
        stats.append(f"rows migrated per second {details['rows_per_second']:,}")
    console.print("  ".join(stats), style="dim", highlight=False)
    if path is None:
        _fail(f"the run record could not be written to {out / 'run.json'}: {unsaved}{kept}", 1)
    console.print(f"run record: {path}", highlight=False)
    if resumed and result.status != "cancelled":
        drop_used_checkpoint(out, result)
    if result.status == "paused":
        print_paused(console, result, out)
        raise typer.Exit(EXIT_PAUSED)
    if result.status == "cancelled" and stop.signum is not None:
        console.print(f"{stop.reason()}: the run was cancelled{kept}", highlight=False)
    raise typer.Exit(_exit_code(result, stop))


def _stop_requested(signum: int) -> bool:
    """Whether ``signum`` asks the run to stop: a Ctrl-C typed in the plan editor does not."""
    return signum != signal.SIGINT or not editor_open()


async def run_until_interrupted(*, stop: StopSignal | None = None, **options: Any) -> RunResult:
    """:func:`hierplan.run`, which the first Ctrl-C or SIGTERM cancels: the run ends
    ``cancelled`` with its record (what finished, what was running), and ``stop`` says which
    signal it was. A second Ctrl-C stops at once."""
    stop = stop or StopSignal()
    handle = start_run(**options)

    async def cancel_on_signal(*, task_status: TaskStatus[None]) -> None:
        # Leaving the receiver gives SIGINT back to Python: the next one interrupts.
        with anyio.open_signal_receiver(*STOP_SIGNALS) as signals:
            task_status.started()
            async for signum in signals:
                if _stop_requested(signum):
                    stop.signum = signum
                    handle.cancel()
                    return

    failure: Exception | None = None
    async with anyio.create_task_group() as watch:
        # Listening before the run starts: a signal while it sets up (a scenario builds its
        # database for seconds) cancels it too, and it ends with a record like any other.
        await watch.start(cancel_on_signal)
        try:
            async with handle:
                result = await handle.result()
        except Exception as exc:  # re-raised as it is, not wrapped by the task group
            failure = exc
        watch.cancel_scope.cancel()
    if failure is not None:
        raise failure
    return result


class _RunKept(Instrument):
    """Keeps the run's context once it starts, so that a signal can cancel it the way
    :meth:`hierplan.RunHandle.cancel` does: the run ends ``cancelled``, with its record."""

    def __init__(self) -> None:
        self.run: RunContext | None = None

    def run_scope(self, run: RunView) -> None:
        """Keep ``run`` (no scope around it)."""
        assert isinstance(run, RunContext)  # the command's own run: a signal may cancel it
        self.run = run


async def resume_until_interrupted(
    run_dir: Path, decision: Any, *, stop: StopSignal | None = None, **options: Any
) -> RunResult:
    """:func:`hierplan.resume`, which a Ctrl-C or SIGTERM stops (``stop`` says which), unless
    it was a Ctrl-C typed in a plan editor. Once the resumed run has started it ends
    ``cancelled`` with its record, as a run does; before that, ``KeyboardInterrupt`` is raised
    and the run is still paused. The checkpoint resumed from is left for the caller to drop
    once the record is saved (:func:`~hierplan.runner.resume.drop_used_checkpoint`)."""
    stop = stop or StopSignal()
    kept = _RunKept()
    options["instruments"] = [*(options.get("instruments") or ()), kept]
    interrupted = False
    failure: Exception | None = None
    result: RunResult | None = None
    async with anyio.create_task_group() as watch:

        async def interrupt() -> None:
            nonlocal interrupted
            with anyio.open_signal_receiver(*STOP_SIGNALS) as signals:
                async for signum in signals:
                    if _stop_requested(signum):
                        stop.signum = signum
                        if kept.run is not None:
                            kept.run.cancel()
                        else:  # nothing ran yet: the resume puts the checkpoint back
                            interrupted = True
                            watch.cancel_scope.cancel()
                        return

        watch.start_soon(interrupt)
        try:
            result = await resume_run(run_dir, decision, drop_checkpoint=False, **options)
        except Exception as exc:  # re-raised as it is, not wrapped by the task group
            failure = exc
        watch.cancel_scope.cancel()
    if interrupted:
        raise KeyboardInterrupt
    if failure is not None:
        raise failure
    assert result is not None
    return result


async def _run_with_console(
    console: Console, *, setup: ReviewSetup, start: Start = run_until_interrupted, **kwargs: Any
) -> RunResult:
    simulated = is_simulated(str(kwargs.get("model", "sim")))
    display = RunConsole(console, simulated=simulated, show_root_plan=setup.mode != "console")
    try:
        approver = setup.approver(console, display)
        return await start(listeners=[display], approver=approver, **kwargs)
    finally:
        display.stop()


def _execute(
    console: Console,
    out: Path,
    setup: ReviewSetup,
    trace: list[str] | None = None,
    trace_content: bool = False,
    resumed: bool = False,
    **kwargs: Any,
) -> NoReturn:
    started = time.monotonic()
    stop = StopSignal()
    try:
        tracing = configure_tracing(trace, capture_content=trace_content or None)
    except HierplanError as exc:
        _fail(str(exc))
    if tracing is not None:
        kwargs["instruments"] = tracing.instruments
    try:
        with export_problems_in_one_line():
            try:
                result = anyio.run(
                    lambda: _run_with_console(console, setup=setup, stop=stop, **kwargs)
                )
            finally:
                if tracing is not None:
                    tracing.shutdown()
    except HierplanError as exc:
        _fail(str(exc))
    except KeyboardInterrupt:
        before = " before the resumed run started: nothing ran, it is still paused"
        _fail(stop.reason() + (before if resumed else ""), stop.exit_code())
    _finish(console, result, out, started, stop, resumed)


@app.command("run")
def run_command(
    ctx: typer.Context,
    goal: GoalArg = None,
    scenario: ScenarioOpt = None,
    goal_file: GoalFileOpt = None,
    strategy: StrategyOpt = "hierarchical",
    model: ModelOpt = "sim",
    max_depth: MaxDepthOpt = DEFAULT_MAX_DEPTH,
    concurrency: ConcurrencyOpt = 8,
    seed: SeedOpt = 0,
    out: RunOutOpt = None,
    overwrite: OverwriteOpt = False,
    yes: YesOpt = False,
    review: ReviewOpt = False,
    pause_for_review: PauseOpt = False,
    review_policy: PolicyOpt = "root",
    sim_profile: ProfileOpt = "typical",
    sim_latency_scale: LatencyOpt = 1.0,
    base_url: BaseUrlOpt = None,
    timeout: TimeoutOpt = None,
    model_retries: ModelRetriesOpt = None,
    set_: SetOpt = None,
    trace: TraceOpt = None,
    trace_content: TraceContentOpt = False,
    budget_usd: BudgetUsdOpt = None,
    budget_tokens: BudgetTokensOpt = None,
    allocation: AllocationOpt = "equal",
    price_in: PriceInOpt = None,
    price_out: PriceOutOpt = None,
) -> None:
    """Plan and run a goal (or a scenario), write DIR/run.json, and show the tree with costs.

    In a terminal the root plan is reviewed before it runs unless --yes is given.
    """
    console = Console()
    try:
        goal, scenario, options = _goal_input(goal, scenario, goal_file)
        # A flag given on the command line wins over the goal file, which wins over defaults.
        options = {k: v for k, v in options.items() if not _given(ctx, k)}
        options |= settings_from_assignments(set_ or [], flags=SETTING_FLAGS)
        _check_choices(str(options.get("strategy", strategy)), sim_profile)
        model = str(options.pop("model", model))
        model_options = _model_options(model, base_url, timeout)
        unpriced = _unpriced_simulation(model, price_in is not None or price_out is not None)
        settings = _run_settings(options, strategy, max_depth, concurrency, seed, model_retries)
        setup = review_setup(
            yes=yes,
            review=review,
            pause=pause_for_review,
            policy=review_policy,
            default=None,
        )
    except HierplanError as exc:
        _fail(str(exc))
    if unpriced is not None:
        Console(stderr=True).print(
            f"warning: {unpriced}", markup=False, highlight=False, soft_wrap=True
        )
    try:
        made = [] if out is not None else _new_run_directory()
    except HierplanError as exc:
        _fail(str(exc))
    run_dir = out or made[0]
    # A run refused before it wrote anything leaves no directory behind: those made here for
    # it are removed if they are still empty when the command ends, however it ends.
    with (
        _removed_if_empty(made),
        _holding(run_dir, otherwise=", or give this run another --out"),
    ):
        _refuse_paused_run(run_dir, start_over=" and give --overwrite")
        if not overwrite:
            _refuse_earlier_run(run_dir, scenario)
        _execute(
            console,
            run_dir,
            setup,
            goal=goal,
            scenario=scenario,
            model=model,
            settings=settings,
            sim_profile=sim_profile,
            sim_latency_scale=sim_latency_scale,
            workdir=run_dir if scenario else None,
            model_options=model_options,
            checkpoint_dir=run_dir,
            checkpoint_extra=setup.saved(),
            trace=trace,
            trace_content=trace_content,
            budget_usd=budget_usd,
            budget_tokens=budget_tokens,
            allocation=allocation,
            price_in=price_in,
            price_out=price_out,
        )


def _new_run_directory() -> list[Path]:
    """Make ``runs/<time>`` for a run without --out; the directories made, innermost first."""
    made = [] if RUNS_DIR.exists() else [RUNS_DIR]
    made.insert(0, new_directory(RUNS_DIR, time.strftime("%Y%m%d-%H%M%S"), "the run"))
    return made


@contextmanager
def _removed_if_empty(directories: list[Path]) -> Iterator[None]:
    """Remove each of ``directories`` (innermost first) on the way out if it is empty."""
    try:
        yield
    finally:
        for directory in directories:
            with suppress(OSError):  # not empty (the run wrote its record), or gone
                directory.rmdir()


def _given(ctx: typer.Context, name: str) -> bool:
    """Whether the option ``name`` was set on the command line (or its environment variable),
    not left to its default."""
    source = ctx.get_parameter_source(name)
    # By name: typer may bring its own copy of click, whose enum is not click's.
    return source is not None and source.name in ("COMMANDLINE", "ENVIRONMENT")


def _goal_input(
    goal: str | None, scenario: str | None, goal_file: Path | None
) -> tuple[str | None, str | None, dict[str, Any]]:
    """The goal and scenario to run, and the settings a ``--goal-file`` gives."""
    options: dict[str, Any] = {}
    if goal_file is not None:
        if goal is not None:
            raise UserInputError("give a goal or --goal-file, not both")
        spec = load_goal_file(goal_file)
        goal, scenario = spec.goal, scenario or spec.scenario
        options = spec.overrides()
    if goal is None and scenario is None:
        raise UserInputError("no goal: give GOAL, --goal-file FILE or --scenario NAME")
    return goal, scenario, options


def _run_settings(
    options: dict[str, Any],
    strategy: str,
    max_depth: int,
    concurrency: int,
    seed: int,
    model_retries: int | None,
) -> RunSettings:
    """The run's settings: the flags, overridden by a goal file's ``options`` (those the
    command line did not set), overridden in turn by ``--model-retries`` when it is given."""
    if model_retries is not None:
        options = {**options, "model_retries": model_retries}
    flags = {"strategy": strategy, "max_depth": max_depth, "concurrency": concurrency, "seed": seed}
    return RunSettings.model_validate({**flags, **options})


def _model_options(model: str, base_url: str | None, timeout: float | None) -> dict[str, Any]:
    """Provider options from ``--base-url`` and ``--timeout`` (only for provider models)."""
    options = provider_options(base_url, timeout)
    if options and is_simulated(model):
        raise UserInputError(SIMULATOR_ONLY)
    return options


def _check_choices(strategy: str, sim_profile: str) -> None:
    if strategy not in STRATEGY_NAMES:
        raise UserInputError(
            f"unknown strategy {strategy!r}: choose one of {', '.join(STRATEGY_NAMES)}"
        )
    if sim_profile not in PROFILES:
        raise UserInputError(
            f"unknown simulator profile {sim_profile!r}: choose one of {', '.join(PROFILES)}"
        )


@app.command("demo")
def demo_command(
    out: Annotated[Path, out_option("Run directory.")] = DEMO_OUT,
    strategy: StrategyOpt = "hierarchical",
    seed: SeedOpt = 0,
    sim_profile: ProfileOpt = "typical",
    sim_latency_scale: LatencyOpt = DEMO_LATENCY_SCALE,
    yes: YesOpt = False,
    review: ReviewOpt = False,
    pause_for_review: PauseOpt = False,
    review_policy: PolicyOpt = "root",
    trace: TraceOpt = None,
    trace_content: TraceContentOpt = False,
) -> None:
    """Migrate the sample shop database on the offline simulator (the data-migration scenario).

    Plans are approved automatically unless --review or --pause-for-review is given.
    """
    console = Console()
    try:
        _check_choices(strategy, sim_profile)
        setup = review_setup(
            yes=yes,
            review=review,
            pause=pause_for_review,
            policy=review_policy,
            default="auto",
        )
        for target in trace or ():
            parse_trace_target(target)  # a bad one is refused before the banner
    except UserInputError as exc:
        _fail(str(exc))
    with _holding(out, otherwise=", or give this demo another --out"):
        _refuse_paused_run(out)
        _refuse_other_record(out)
        console.print(
            "[bold]hierplan demo[/]: migrate a 14-table SQLite shop database (~290k rows) into a "
            "new one. Planning runs on the offline simulator: [bold yellow]SIMULATED[/] model "
            f"answers, real tools and real data (simulated model latency x{sim_latency_scale:g}).",
            highlight=False,
        )
        _execute(
            console,
            out,
            setup,
            scenario=DEMO_SCENARIO,
            settings=RunSettings.model_validate({"strategy": strategy, "seed": seed}),
            sim_profile=sim_profile,
            sim_latency_scale=sim_latency_scale,
            workdir=out,
            checkpoint_dir=out,
            checkpoint_extra=setup.saved(),
            trace=trace,
            trace_content=trace_content,
        )


@app.command("resume")
def resume_command(
    run_dir: Annotated[Path, typer.Argument(help="The directory of a paused run.")],
    approve: Annotated[
        bool, typer.Option("--approve", help="Approve the pending plan(s) as they are.")
    ] = False,
    reject: Annotated[
        str | None,
        typer.Option("--reject", metavar="REASON", help="Reject; the reason goes to the planner."),
    ] = None,
    plan_file: Annotated[
        Path | None,
        typer.Option("--plan", metavar="FILE", help="Run this edited plan (YAML or JSON) instead."),
    ] = None,
    node: Annotated[
        str | None,
        typer.Option("--node", metavar="PATH", help="Decide for this node only (e.g. 1.3)."),
    ] = None,
    version: Annotated[
        int | None,
        typer.Option(
            "--version",
            metavar="N",
            help="Decide only if the plan waiting is version N (as in pending/<node>.yaml).",
        ),
    ] = None,
    by: Annotated[
        str | None, typer.Option("--by", help="Who decides, for the audit trail.")
    ] = None,
    yes: YesOpt = False,
    review: ReviewOpt = False,
    pause_for_review: PauseOpt = False,
    review_policy: Annotated[
        str | None,
        typer.Option("--review-policy", help=f"{POLICY_HELP}; default: as the run was started."),
    ] = None,
    trace: TraceOpt = None,
    trace_content: TraceContentOpt = False,
) -> None:
    """Continue a paused run with a decision on its pending plan(s).

    Later plans are reviewed the way the run was started, unless --yes, --review or
    --pause-for-review says otherwise.
    """
    console = Console()
    try:
        who = by or f"{reviewer_name()} via hierplan resume"
        decision = resume_decision(approve, reject, plan_file, who, review=review)
    except HierplanError as exc:
        _fail(str(exc))
    if run_dir.exists() and not run_dir.is_dir():
        _fail(
            f"{run_dir} is a file: hierplan resume takes the paused run's directory (the --out "
            f"it ran with), e.g. {shlex.quote(str(run_dir.parent))}"
        )
    # Held before the checkpoint is read: a run or resume writing the directory may replace it.
    with _holding(run_dir, otherwise=""):
        try:
            checkpoint = load_checkpoint(run_dir)
            model = _saved_model_name(checkpoint.invocation, run_dir)
            saved = checkpoint.extra
            flags = yes or review or pause_for_review
            setup = review_setup(
                yes=yes,
                review=review,
                pause=pause_for_review,
                policy=review_policy or str(saved.get("review_policy", "root")),
                default=None if flags else saved_mode(saved),
            )
        except HierplanError as exc:
            _fail(str(exc))
        _execute(
            console,
            run_dir,
            setup,
            start=partial(resume_until_interrupted, run_dir, decision, node=node, version=version),
            model=model,
            checkpoint_extra=setup.saved(),
            trace=trace,
            trace_content=trace_content,
            resumed=True,
        )


def _saved_model_name(invocation: dict[str, Any], run_dir: Path) -> str:
    """The model a paused run used, by name; a run started in Python with a model object
    cannot go on from the command line (without this, it went on on the simulator)."""
    model = invocation.get("model")
    if not isinstance(model, str) or invocation.get("executor_model_object"):
        raise UserInputError(
            f"the run paused in {run_dir} was started in Python with a model object, not a "
            "model name, so the command line cannot go on with that model: resume it in "
            "Python with hierplan.resume(run_dir, decision, model=..., executor_model=...)"
        )
    return model


@app.command("view")
def view_command(
    run_json: Annotated[
        Path,
        typer.Argument(
            help="A run.json written by run, demo or batch, or the run directory holding it."
        ),
    ],
    html: Annotated[
        Path | None,
        typer.Option("--html", help="Write a self-contained HTML report to this file instead."),
    ] = None,
) -> None:
    """Show a finished run: the tree with status, tokens and cost at each node and level."""
    try:
        record = _run_record_path(run_json)
        result = RunResult.load(record)
        with _unshowable(record):
            if html is not None:
                _refuse_to_replace(html)
                path = write_html(result, html)
            else:
                shown = render_run(result)
    except HierplanError as exc:
        _fail(str(exc))
    except OSError as exc:
        _fail(f"cannot write {html}: {exc.strerror or exc}")
    if html is not None:
        Console().print(f"HTML report: {path}", highlight=False, markup=False, soft_wrap=True)
        return
    Console().print(shown)


def _refuse_to_replace(html: Path) -> None:
    """Refuse to write a report over a file that is not an HTML page (a run.json, say): only
    an earlier report is replaced."""
    if not html.exists():
        return
    if html.is_file():
        with html.open("rb") as page:
            start = page.read(512).lstrip(b"\xef\xbb\xbf \t\r\n").lower()
        if start.startswith((b"<!doctype html", b"<html")):
            return
    raise UserInputError(
        f"{html} exists and is not an HTML report, so --html will not replace it: give "
        "--html a new file name (an earlier report is replaced)"
    )


@contextmanager
def _unshowable(record: Path) -> Iterator[None]:
    """Say in one line that ``record`` cannot be shown when rendering it trips: a record that
    passed validation may still hold a figure of a shape this version does not know (a run's
    budget, stats and verification are free-form: a record written by another version, or
    edited by hand)."""
    try:
        yield
    except (TypeError, ValueError, KeyError, AttributeError, IndexError) as exc:
        raise UserInputError(
            f"{record} is not a run record this version of hierplan can show "
            f"({type(exc).__name__}: {one_line(str(exc))})"
        ) from None


def _run_record_path(given: Path) -> Path:
    """``given``, or the ``run.json`` in it when it is a run directory (as ``resume`` takes)."""
    if not given.is_dir():
        return given
    if not (given / "run.json").is_file():
        raise UserInputError(
            f"{given} holds no run.json: give a run directory or a run.json (a batch keeps one "
            "per goal, in goals/<id>/run.json)"
        )
    return given / "run.json"


@app.command("validate")
def validate_command(
    plan_file: Annotated[Path, typer.Argument(help="A plan as YAML or JSON.")],
    tools: Annotated[
        str | None, typer.Option("--tools", help="Comma-separated allowed tools.")
    ] = None,
    max_steps: Annotated[
        int, typer.Option("--max-steps", min=1, help="Most steps the plan may have.")
    ] = DEFAULT_MAX_STEPS,
    max_depth: Annotated[
        int,
        typer.Option(
            "--max-depth",
            min=1,
            help="Deepest plan level, the plan itself being level 1 (1: no sub-goals).",
        ),
    ] = DEFAULT_MAX_DEPTH,
) -> None:
    """Check a plan file: schema, ids, dependencies, $id references, cycles, size, depth and
    tools."""
    console = Console()
    try:
        plan = load_plan(plan_file)
    except HierplanError as exc:
        _fail(str(exc))
    allowed = None if tools is None else [t.strip() for t in tools.split(",") if t.strip()]
    problems = validate_plan(plan, tools=allowed, max_steps=max_steps, max_depth=max_depth)
    console.print(plan_tree(plan))
    if problems:
        for p in problems:
            console.print(f"problem: {p}", style="red", markup=False, highlight=False)
        raise typer.Exit(1)
    named = sorted(
        {s.tool for s in plan.steps if s.tool} | {t for s in plan.steps for t in s.tools or ()}
    )
    if allowed is None and named:
        # Without --tools there is nothing to check the names against: a typo would pass.
        console.print(
            f"plan is valid, but its tools were not checked ({', '.join(named)}): give the "
            "tools a run has with --tools a,b to check them",
            style="yellow",
            markup=False,
            highlight=False,
        )
        return
    console.print("plan is valid", style="green")


@app.command("scenarios")
def scenarios_command() -> None:
    """List the built-in scenarios."""
    console = Console()
    for name, found in sorted(scenarios().items()):
        console.print(f"[bold]{name}[/]: {found.description}", highlight=False)


register_batch_commands(app)
app.command("bench")(bench_command)


# The parser's error for a command line it refuses: click's UsageError, which newer typer
# versions vendor; BadParameter derives from it in either.
_USAGE_ERROR = cast("type[Exception]", typer.BadParameter.__mro__[1])


def main() -> None:
    """Entry point of the ``hierplan`` script.

    A command line the parser refuses (an unknown option, a value out of range, a missing
    argument) is one ``error:`` line naming the help to read, like every other bad input.
    """
    try:
        code = app(standalone_mode=False)
    except _USAGE_ERROR as exc:
        error: Any = exc
        if type(exc).__name__ == "NoArgsIsHelpError":
            # The help, as asked for by giving nothing: on stdout, as --help prints it (click's
            # plain formatter would print it to stderr, as an error).
            typer.echo(error.ctx.get_help())
            sys.exit(error.exit_code)
        where = error.ctx.command_path if error.ctx is not None else "hierplan"
        message = " ".join(error.format_message().split())
        try:
            _fail(f"{message} (see {where} --help)", error.exit_code)
        except typer.Exit as stop:
            sys.exit(stop.exit_code)
    except typer.Abort:
        sys.exit(1)
    sys.exit(code if isinstance(code, int) else 0)
