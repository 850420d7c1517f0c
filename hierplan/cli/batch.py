"""``hierplan batch`` and ``hierplan worker``.

Exit status of ``batch``: 0 when every goal succeeded; 1 when some failed or were skipped; 2 for
bad input (nothing started, nothing written); 130 when interrupted (resume with ``--resume``).
"""

from __future__ import annotations

import shlex
import time
from collections.abc import Mapping
from pathlib import Path
from types import MappingProxyType
from typing import Annotated, Any, NoReturn
from urllib.parse import urlsplit, urlunsplit

import anyio
import typer
from rich.console import Console

from hierplan.batch.budget import BatchBudget
from hierplan.batch.core import DEFAULT_CONCURRENCY, Batch, BatchConfig, execute, prepare
from hierplan.batch.display import BatchDisplay, summary_table
from hierplan.batch.runner import RunOptions
from hierplan.budgets.budget import ALLOCATIONS, DEFAULT_ALLOCATION, MAX_BUDGET_TOKENS, Budget
from hierplan.budgets.redis_ledger import check_reachable
from hierplan.cli.options import (
    AllocationOpt,
    BaseUrlOpt,
    LatencyOpt,
    McpOpt,
    ModelOpt,
    PriceInOpt,
    PriceOutOpt,
    ProfileOpt,
    ReservationOpt,
    StrategyOpt,
    TimeoutOpt,
    ToolsOpt,
    TraceOpt,
    fail,
    out_option,
)
from hierplan.core.settings import MAX_SEED, STRATEGY_NAMES
from hierplan.errors import HierplanError, UserInputError
from hierplan.models.counting import DEFAULT_RESERVATION, check_reservation
from hierplan.runner.goals import settings_from_assignments
from hierplan.runner.models import check_base_url
from hierplan.simulator.profiles import PROFILES
from hierplan.tools.config import entries_from_flags
from hierplan.tracing.setup import (
    TraceSetup,
    configure_tracing,
    export_problems_in_one_line,
)
from hierplan.units import usd_to_pico

BrokerOpt = Annotated[
    str | None,
    typer.Option("--broker", help="Redis URL of the Celery broker and the shared ledger."),
]
VisibilityOpt = Annotated[
    float,
    typer.Option(
        "--visibility-timeout",
        min=1.0,
        help="Seconds before a goal whose worker died is delivered again (> the longest goal).",
    ),
]

LeaseOpt = Annotated[
    float | None,
    typer.Option(
        "--lease",
        metavar="SECONDS",
        help="Celery: seconds a running goal's lease lasts without its worker's heartbeat "
        "before the goal is queued again (at least 1) [default: $HIERPLAN_BATCH_LEASE_S, "
        "else 30]",
    ),
]


def _pico(usd: float | None) -> int | None:
    if usd is None:
        return None
    Budget(usd=usd)  # checked as a run's budget is: finite, at most MAX_BUDGET_USD
    return usd_to_pico(usd)


GoalsArg = Annotated[Path, typer.Argument(help="The goals file: one JSON object per line.")]
OutOpt = Annotated[Path, out_option("The batch's directory (journal, run records).")]
BudgetUsdOpt = Annotated[
    float | None, typer.Option("--budget-usd", min=0.0, help="The whole batch's budget in USD.")
]
BudgetTokensOpt = Annotated[
    int | None,
    typer.Option(
        "--budget-tokens", min=0, max=MAX_BUDGET_TOKENS, help="The whole batch's budget in tokens."
    ),
]
ConcurrencyOpt = Annotated[
    int, typer.Option("--concurrency", "-c", min=1, help="Goals running at once.")
]
ResumeOpt = Annotated[
    bool, typer.Option("--resume", help="Continue the batch in --out after a crash.")
]
BackendOpt = Annotated[
    str, typer.Option("--backend", help="local (this process) or celery (workers).")
]
GoalUsdOpt = Annotated[
    float | None,
    typer.Option(
        "--goal-budget-usd",
        min=0.0,
        help="Cap of a goal that sets none (default: the budget / --concurrency).",
    ),
]
GoalTokensOpt = Annotated[
    int | None,
    typer.Option(
        "--goal-budget-tokens",
        min=0,
        max=MAX_BUDGET_TOKENS,
        help="Token cap of a goal that sets none.",
    ),
]
SeedOpt = Annotated[
    int,
    typer.Option(
        "--seed",
        min=0,
        max=MAX_SEED,
        help="The batch's simulator seed: a goal without a seed of its own gets one derived "
        "from it and the goal's id.",
    ),
]


SetOpt = Annotated[
    list[str] | None,
    typer.Option(
        "--set",
        metavar="KEY=VALUE",
        help="A run setting of every goal, e.g. executor_max_tokens=4096 (repeatable).",
    ),
]
# The run settings the batch sets by flags of its own: --set refuses them. (--concurrency is
# goals at once here; a goal's steps at once is --set concurrency=N.)
SETTING_FLAGS: Mapping[str, str] = MappingProxyType({"strategy": "--strategy", "seed": "--seed"})


def batch_command(
    context: typer.Context,
    goals: GoalsArg,
    out: OutOpt,
    budget_usd: BudgetUsdOpt = None,
    budget_tokens: BudgetTokensOpt = None,
    concurrency: ConcurrencyOpt = DEFAULT_CONCURRENCY,
    resume: ResumeOpt = False,
    backend: BackendOpt = "local",
    broker: BrokerOpt = None,
    goal_budget_usd: GoalUsdOpt = None,
    goal_budget_tokens: GoalTokensOpt = None,
    model: ModelOpt = "sim",
    strategy: StrategyOpt = "hierarchical",
    allocation: AllocationOpt = DEFAULT_ALLOCATION,
    reservation: ReservationOpt = DEFAULT_RESERVATION,
    seed: SeedOpt = 0,
    sim_profile: ProfileOpt = "typical",
    sim_latency_scale: LatencyOpt = 1.0,
    visibility_timeout: VisibilityOpt = 3600.0,
    lease: LeaseOpt = None,
    trace: TraceOpt = None,
    set_: SetOpt = None,
    base_url: BaseUrlOpt = None,
    timeout: TimeoutOpt = None,
    price_in: PriceInOpt = None,
    price_out: PriceOutOpt = None,
    tools: ToolsOpt = None,
    mcp: McpOpt = None,
) -> None:
    """Run many goals under one global budget, journaled in DIR (resumable with --resume).

    Every line of GOALS is validated before anything starts. Each goal gets a grant of the
    budget before it starts; when what is left cannot cover a goal, the goal is recorded as
    not started. Writes DIR/goals/<id>/run.json per goal and DIR/summary.json.
    """
    given = dict(locals())
    tracing = None
    try:
        _check_choices(backend, strategy, allocation, sim_profile, broker, trace)
        if lease is not None:
            _check_lease(lease, backend)
        tracing = configure_tracing(trace) if backend == "local" else None
        config = _config(given, tracing, _given_flags(context))
        if broker is not None:
            # Before the batch's directory is made: a broker that is down leaves nothing to
            # resume, and the command can be given again as it was once Redis is up.
            check_reachable(broker, _hide_password(broker))
        batch = prepare(config)
    except HierplanError as exc:
        if tracing is not None:
            tracing.shutdown()
        fail(str(exc))
    _run(batch, tracing)


def _check_lease(lease: float, backend: str) -> None:
    """``--lease``: Celery's only, a number of seconds a lease may last."""
    if backend != "celery":
        raise UserInputError("--lease applies to --backend celery only")
    # Imported here: the Celery side stays out of the command line's start-up.
    from hierplan.batch.celery_backend.lease import lease_seconds

    lease_seconds(lease, name="--lease")


def _config(
    given: Mapping[str, Any], tracing: TraceSetup | None, flags: frozenset[str]
) -> BatchConfig:
    """The batch's configuration from the command line's values (``given``, by parameter
    name; ``flags``: the options given), checked as it is built."""
    budget = BatchBudget(
        given["budget_tokens"],
        _pico(given["budget_usd"]),
        given["concurrency"],
        given["goal_budget_tokens"],
        _pico(given["goal_budget_usd"]),
    )
    base_url = given["base_url"]
    options = RunOptions(
        model=given["model"],
        strategy=given["strategy"],
        allocation=given["allocation"],
        reservation=check_reservation(given["reservation"]),
        seed=given["seed"],
        sim_profile=given["sim_profile"],
        sim_latency_scale=given["sim_latency_scale"],
        run_settings=settings_from_assignments(given["set_"] or [], flags=SETTING_FLAGS),
        base_url=None if base_url is None else check_base_url(base_url),
        timeout=given["timeout"],
        price_in=given["price_in"],
        price_out=given["price_out"],
        tools=[
            entry.saved() for entry in entries_from_flags(given["tools"] or [], given["mcp"] or [])
        ],
    )
    return BatchConfig(
        goals_path=given["goals"],
        out=given["out"],
        budget=budget,
        options=options,
        backend="celery" if given["backend"] == "celery" else "local",
        resume=given["resume"],
        broker=given["broker"],
        visibility_timeout=given["visibility_timeout"],
        lease_s=given["lease"],
        instruments=tracing.instruments if tracing is not None else (),
        given=flags,
    )


def _given_flags(context: typer.Context) -> frozenset[str]:
    """The options given on this command line (not left at their defaults), as flags."""
    given: set[str] = set()
    for name in context.params:
        source = context.get_parameter_source(name)
        if source is not None and source.name != "DEFAULT":
            given.add("--" + name.rstrip("_").replace("_", "-"))  # set_ is --set
    return frozenset(given)


def _check_choices(
    backend: str,
    strategy: str,
    allocation: str,
    sim_profile: str,
    broker: str | None,
    trace: list[str] | None,
) -> None:
    """The options that name one of a set, and those that go with one backend only."""
    if backend not in ("local", "celery"):
        raise UserInputError(f"unknown backend {backend!r}: choose local or celery")
    if strategy not in STRATEGY_NAMES:
        raise UserInputError(
            f"unknown strategy {strategy!r}: choose one of {', '.join(STRATEGY_NAMES)}"
        )
    if allocation not in ALLOCATIONS:
        raise UserInputError(
            f"unknown allocation {allocation!r}: choose one of {', '.join(ALLOCATIONS)}"
        )
    if sim_profile not in PROFILES:
        raise UserInputError(
            f"unknown simulator profile {sim_profile!r}: choose one of {', '.join(PROFILES)}"
        )
    if backend == "celery" and broker is None:
        raise UserInputError("--backend celery needs --broker redis://HOST:PORT/DB")
    if backend == "local" and broker is not None:
        raise UserInputError("--broker applies to --backend celery only")
    if trace and backend == "celery":
        raise UserInputError("on Celery, give --trace to each `hierplan worker` instead")


def _run(batch: Batch, tracing: TraceSetup | None) -> NoReturn:
    """Run a prepared batch under the live display, print its summary, exit with its status."""
    console = Console()
    config = batch.config
    started = time.monotonic()
    display = BatchDisplay(console, batch.tally())
    batch.display = display
    try:
        with export_problems_in_one_line():
            try:
                with display:
                    summary = anyio.run(execute, batch)
            finally:
                batch.journal.close()
                if tracing is not None:
                    tracing.shutdown()
    except HierplanError as exc:
        fail(str(exc))
    except KeyboardInterrupt:
        fail(f"interrupted; continue with: {resume_command(config)}", 130)
    console.print(summary_table(summary))
    console.print(
        f"journal: {config.out / 'journal.sqlite'}  summary: {config.out / 'summary.json'}  "
        f"({time.monotonic() - started:.1f} s)",
        highlight=False,
    )
    counts = summary["counts"]
    raise typer.Exit(0 if counts["succeeded"] == summary["goals"] else 1)


def resume_command(config: BatchConfig) -> str:
    """The command that continues ``config``'s batch, as a shell would take it: the budget and
    options come from the journal, but the backend and the broker must be named again (a
    password in the broker's URL is not shown)."""
    words = ["hierplan", "batch", str(config.goals_path), "--out", str(config.out), "--resume"]
    if config.backend != "local":
        words += ["--backend", config.backend]
    if config.broker is not None:
        words += ["--broker", _hide_password(config.broker)]
    return shlex.join(words)


def _hide_password(url: str) -> str:
    parts = urlsplit(url)
    if parts.password is None:
        return url
    user = f"{parts.username}:" if parts.username else ":"
    host = parts.netloc.rsplit("@", 1)[1]
    return urlunsplit(parts._replace(netloc=f"{user}PASSWORD@{host}"))


def worker_command(
    broker: Annotated[
        str, typer.Option("--broker", help="Redis URL of the broker and the shared ledger.")
    ],
    concurrency: Annotated[
        int, typer.Option("--concurrency", "-c", min=1, help="Goals this worker runs at once.")
    ] = 4,
    visibility_timeout: VisibilityOpt = 3600.0,
    workdir: Annotated[
        Path | None,
        typer.Option("--workdir", help="Where scenario goals set up their files (a temp dir)."),
    ] = None,
    trace: TraceOpt = None,
) -> None:
    """Start a Celery worker for `hierplan batch --backend celery` (threads pool, one event
    loop per process, messages acknowledged when a goal ends)."""
    from hierplan.batch.celery_backend import run_worker

    try:
        tracing = configure_tracing(trace)
    except HierplanError as exc:
        fail(str(exc))
    try:
        run_worker(
            broker,
            concurrency=concurrency,
            visibility_timeout=visibility_timeout,
            workdir=workdir,
            instruments=tracing.instruments if tracing is not None else None,
        )
    except HierplanError as exc:
        fail(str(exc))
    finally:
        if tracing is not None:
            tracing.shutdown()
