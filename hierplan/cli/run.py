"""``hierplan run`` and ``hierplan demo``: a goal (or a scenario) from the command line or a goal
file, made into a :class:`~hierplan.RunSpec` and run in a run directory."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console

from hierplan.budgets.budget import DEFAULT_ALLOCATION
from hierplan.cli.options import (
    SETTING_FLAGS,
    AllocationOpt,
    BaseUrlOpt,
    BudgetTokensOpt,
    BudgetUsdOpt,
    LatencyOpt,
    MaxDepthOpt,
    McpOpt,
    ModelOpt,
    ModelRetriesOpt,
    PauseOpt,
    PolicyOpt,
    PriceInOpt,
    PriceOutOpt,
    ProfileOpt,
    ReservationOpt,
    ReviewOpt,
    SeedOpt,
    SetOpt,
    StrategyOpt,
    TimeoutOpt,
    ToolsOpt,
    TraceContentOpt,
    TraceOpt,
    YesOpt,
    fail,
    out_option,
)
from hierplan.cli.review import review_setup
from hierplan.cli.running import (
    DEMO_SCENARIO,
    Launcher,
    execute_command,
    holding,
    new_run_directory,
    refuse_earlier_run,
    refuse_other_record,
    refuse_paused_run,
    removed_if_empty,
)
from hierplan.core.instrument import Instrument
from hierplan.errors import HierplanError, UserInputError
from hierplan.hierarchy.gate import Approver
from hierplan.models.base import parse_model_string
from hierplan.models.counting import DEFAULT_RESERVATION, check_reservation
from hierplan.plans.plan import DEFAULT_MAX_DEPTH
from hierplan.pricing import PriceTable
from hierplan.runner.goals import load_goal_file, settings_from_assignments
from hierplan.runner.handle import RunHandle, start
from hierplan.runner.models import SIMULATOR_ONLY
from hierplan.runner.spec import (
    BudgetSpec,
    ModelChoice,
    ModelSpec,
    RunSpec,
    is_simulated,
    settings_with,
)
from hierplan.simulator.profiles import Simulator
from hierplan.tools.config import ToolsetSpec, entries_from_flags
from hierplan.tracing.setup import parse_trace_target
from hierplan.view.console import RunConsole

DEMO_OUT = Path("runs/demo")
# The typical profile models a hosted model's speed (10 ms per output token); the demo runs it at a
# quarter of that so a first look takes seconds, not a minute. --sim-latency-scale 1 restores it.
DEMO_LATENCY_SCALE = 0.25

GoalArg = Annotated[str | None, typer.Argument(help="The goal, as free text (needs a real model).")]
ScenarioOpt = Annotated[str | None, typer.Option("--scenario", help="Run a built-in scenario.")]
GoalFileOpt = Annotated[Path | None, typer.Option("--goal-file", help="A YAML/JSON goal file.")]
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


def model_choice(
    model: str,
    *,
    profile: str = "typical",
    latency_scale: float = 1.0,
    base_url: str | None = None,
    timeout: float | None = None,
) -> ModelChoice:
    """The model the flags name: the simulator with ``--sim-profile`` and
    ``--sim-latency-scale``, or a provider's model with ``--base-url`` and ``--timeout``
    (refused for the simulator)."""
    if not is_simulated(model):
        return ModelSpec(name=model, base_url=base_url, timeout_s=timeout)
    if base_url is not None or timeout is not None:
        raise UserInputError(SIMULATOR_ONLY)
    priced_as = parse_model_string(model).name or None
    return Simulator(profile=profile, latency_scale=latency_scale, priced_as=priced_as)


def unpriced_simulation(model: str, priced: bool) -> str | None:
    """A warning when ``model`` is a simulated model priced as one the price table does not
    know (``sim:my-model`` without ``--price-in``/``--price-out``): its calls have no cost,
    where the user likely meant a real model's. ``None`` when there is nothing to say."""
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


def launcher(spec: RunSpec, out: Path) -> Launcher:
    """How the command starts ``spec``'s run, with its run directory as the checkpoint's."""

    def launch(display: RunConsole, approver: Approver, traced: list[Instrument]) -> RunHandle:
        return start(
            spec, listeners=[display], approver=approver, instruments=traced, checkpoint_dir=out
        )

    return launch


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
    allocation: AllocationOpt = DEFAULT_ALLOCATION,
    reservation: ReservationOpt = DEFAULT_RESERVATION,
    price_in: PriceInOpt = None,
    price_out: PriceOutOpt = None,
    tools: ToolsOpt = None,
    mcp: McpOpt = None,
) -> None:
    """Plan and run a goal (or a scenario), write DIR/run.json, and show the tree with costs.

    In a terminal the root plan is reviewed before it runs unless --yes is given.
    """
    flags = {k: v for k, v in ctx.params.items() if _given(ctx, k)}
    try:
        spec, warning = _spec_of_command_line(goal, scenario, goal_file, ctx.params, flags)
        setup = review_setup(
            yes=yes, review=review, pause=pause_for_review, policy=review_policy, default=None
        )
    except HierplanError as exc:
        fail(str(exc))
    spec = spec.model_copy(update={"extra": setup.saved()})
    if warning is not None:
        Console(stderr=True).print(
            f"warning: {warning}", markup=False, highlight=False, soft_wrap=True
        )
    try:
        made = [] if out is not None else new_run_directory()
    except HierplanError as exc:
        fail(str(exc))
    run_dir = out or made[0]
    if spec.scenario is not None:
        spec = spec.model_copy(update={"workdir": run_dir})
    # A run refused before it wrote anything leaves no directory behind: those made here for
    # it are removed if they are still empty when the command ends, however it ends.
    with removed_if_empty(made), holding(run_dir, otherwise=", or give this run another --out"):
        refuse_paused_run(run_dir, start_over=" and give --overwrite")
        if not overwrite:
            refuse_earlier_run(run_dir, None if spec.scenario is None else str(spec.scenario))
        execute_command(
            Console(),
            run_dir,
            setup,
            launcher(spec, run_dir),
            simulated=spec.simulated,
            trace=trace,
            trace_content=trace_content,
        )


def _spec_of_command_line(
    goal: str | None,
    scenario: str | None,
    goal_file: Path | None,
    params: dict[str, Any],
    flags: dict[str, Any],
) -> tuple[RunSpec, str | None]:
    """The run the command line describes (a flag given wins over the goal file, which wins
    over the flags' defaults), and a warning to print first, if any."""
    goal, scenario, from_file, file_tools = _goal_input(goal, scenario, goal_file)
    options = {k: v for k, v in from_file.items() if k not in flags}
    # The flags' toolsets join the file's: a run gets every toolset either names.
    tools = (*file_tools, *entries_from_flags(params.get("tools") or [], params.get("mcp") or []))
    options |= settings_from_assignments(params.get("set_") or [], flags=SETTING_FLAGS)
    model = str(options.pop("model", params["model"]))
    settings = {
        name: params[name] for name in ("strategy", "max_depth", "concurrency", "seed")
    } | options
    if params.get("model_retries") is not None:
        settings["model_retries"] = params["model_retries"]
    price_in, price_out = params.get("price_in"), params.get("price_out")
    budget = BudgetSpec(
        usd=params.get("budget_usd"),
        tokens=params.get("budget_tokens"),
        allocation=params.get("allocation", DEFAULT_ALLOCATION),
        reservation=check_reservation(params.get("reservation", DEFAULT_RESERVATION)),
    )
    spec = RunSpec(
        goal=goal,
        scenario=scenario,
        settings=settings_with(settings, {}),
        model=model_choice(
            model,
            profile=params["sim_profile"],
            latency_scale=params["sim_latency_scale"],
            base_url=params.get("base_url"),
            timeout=params.get("timeout"),
        ),
        budget=budget if budget.limited else None,
        price_in=price_in,
        price_out=price_out,
        tools=tools,
    )
    return spec, unpriced_simulation(model, price_in is not None or price_out is not None)


def _given(ctx: typer.Context, name: str) -> bool:
    """Whether the option ``name`` was set on the command line (or its environment variable),
    not left to its default."""
    source = ctx.get_parameter_source(name)
    # By name: typer may bring its own copy of click, whose enum is not click's.
    return source is not None and source.name in ("COMMANDLINE", "ENVIRONMENT")


def _goal_input(
    goal: str | None, scenario: str | None, goal_file: Path | None
) -> tuple[str | None, str | None, dict[str, Any], tuple[ToolsetSpec, ...]]:
    """The goal and scenario to run, and the settings and toolsets a ``--goal-file`` gives."""
    options: dict[str, Any] = {}
    tools: tuple[ToolsetSpec, ...] = ()
    if goal_file is not None:
        if goal is not None:
            raise UserInputError("give a goal or --goal-file, not both")
        spec = load_goal_file(goal_file)
        goal, scenario = spec.goal, scenario or spec.scenario
        options, tools = spec.overrides(), spec.tools
    if goal is None and scenario is None:
        raise UserInputError("no goal: give GOAL, --goal-file FILE or --scenario NAME")
    return goal, scenario, options, tools


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
        setup = review_setup(
            yes=yes, review=review, pause=pause_for_review, policy=review_policy, default="auto"
        )
        spec = RunSpec(
            scenario=DEMO_SCENARIO,
            settings=settings_with({"strategy": strategy, "seed": seed}, {}),
            model=Simulator(profile=sim_profile, latency_scale=sim_latency_scale),
            workdir=out,
            extra=setup.saved(),
        )
        for target in trace or ():
            parse_trace_target(target)  # a bad one is refused before the banner
    except HierplanError as exc:
        fail(str(exc))
    with holding(out, otherwise=", or give this demo another --out"):
        refuse_paused_run(out)
        refuse_other_record(out)
        console.print(
            "[bold]hierplan demo[/]: migrate a 14-table SQLite shop database (~290k rows) into a "
            "new one. Planning runs on the offline simulator: [bold yellow]SIMULATED[/] model "
            f"answers, real tools and real data (simulated model latency x{sim_latency_scale:g}).",
            highlight=False,
        )
        execute_command(
            console,
            out,
            setup,
            launcher(spec, out),
            simulated=True,
            trace=trace,
            trace_content=trace_content,
        )
