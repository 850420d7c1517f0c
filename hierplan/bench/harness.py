"""The benchmark harness: every (suite, task, seed, strategy) as one :func:`hierplan.run`.

Every strategy gets the same tasks, tools, model and settings; only the strategy differs (a
suite that is a fixed setting, PlanBench's own, runs under its one strategy). Runs go
``concurrency`` at a time in one event loop. Each finished run is appended to ``results.jsonl``
at once, so an interrupted benchmark keeps what it did and ``resume`` carries on from there.

A run's record (:mod:`hierplan.bench.records`) holds its outcome by the suite's verifier and by
what the agent reported, tokens by role, calls, replans, depth, latency and cost, and where it
comes from: the task's public name, the code's version and commit, the simulator's knobs, the
latency scale and the model's price. Records made with the simulator say so.
"""

from __future__ import annotations

import json
import math
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import anyio
from pydantic import ValidationError

from hierplan.bench import outdir
from hierplan.bench.base import MAX_TASK_INDEX, MAX_TASK_SEED, BenchTask, Suite
from hierplan.bench.outdir import MANIFEST, RESULTS, identity_differences, load_results
from hierplan.bench.provenance import code_version
from hierplan.bench.records import (
    NOT_STARTED,
    failed_record,
    model_name,
    model_price,
    not_started_record,
    run_record,
    simulator_seed,
)
from hierplan.bench.suites import get_suite, suite_names
from hierplan.core.instrument import Instrument
from hierplan.core.settings import RunSettings, strategy_names
from hierplan.core.views import NodeView
from hierplan.errors import HierplanError, ModelAuthError, UserInputError
from hierplan.models.base import Model, ToolCall, close_model, parse_model_string
from hierplan.redact import redact, redact_data
from hierplan.runner.models import SIMULATOR_ONLY, check_base_url, resolve_model
from hierplan.runner.run import execute
from hierplan.runner.spec import ModelChoice, RunSpec, is_simulated
from hierplan.scenarios.base import Verification
from hierplan.simulator.model import SimulatedModel
from hierplan.simulator.oracle import Oracle
from hierplan.simulator.profiles import PROFILES, NoiseProfile, Simulator
from hierplan.tools.config import ToolsetSpec

__all__ = [
    "MANIFEST",
    "RESULTS",
    "Admission",
    "BenchConfig",
    "BenchRun",
    "RunGate",
    "check_config",
    "identity_differences",
    "load_results",
    "model_name",
    "parse_list",
    "plan_runs",
    "run_bench",
    "run_one",
    "simulator_seed",
    "suites_of",
]


@dataclass(slots=True, frozen=True)
class BenchConfig:
    """What to run. ``model`` is ``sim`` (the simulator, with ``profile``) or a provider string.

    Tasks are generated (or, for a public set, chosen) from ``task_seed``; ``tasks`` of them a
    suite, or ``None`` for every task of a public set's ``split``. Seeds ``0 .. seeds-1`` seed
    the simulator, so each task runs ``seeds`` times under every strategy, paired across
    strategies. ``save_runs`` keeps each run's ``run.json`` in the benchmark's directory.
    """

    suites: tuple[str, ...]
    strategies: tuple[str, ...]
    tasks: int | None
    seeds: int = 1
    model: str = "sim"
    concurrency: int = 4
    profile: NoiseProfile = field(default_factory=lambda: PROFILES["typical"])
    latency_scale: float = 1.0
    task_seed: int = 0
    max_depth: int | None = None
    base_url: str | None = None
    timeout_s: float | None = None
    run_settings: Mapping[str, Any] = field(default_factory=dict)
    """Other run settings of every run (``--set``), checked: the same for every strategy."""
    tools: tuple[ToolsetSpec, ...] = ()
    """Toolsets every run gets beside its task's tools (``--tools``, ``--mcp``)."""
    split: str | None = None
    """The split of the suites that have splits (``None``: each one's default)."""
    price_in: float | None = None
    """USD per million input tokens of the model (``None``: the price table's)."""
    price_out: float | None = None
    """USD per million output tokens of the model (``None``: the price table's)."""
    save_runs: bool = False

    @property
    def simulated(self) -> bool:
        """Whether the model is the offline simulator."""
        return self.model.split(":", 1)[0] == "sim"

    def identity(self) -> dict[str, Any]:
        """What must match for a resumed benchmark to continue this one: the settings, the
        model's price and the code (see :mod:`hierplan.bench.outdir`), with the credentials of a
        base URL redacted: the file is kept with the results."""
        return {
            "model": self.model,
            "profile": self.profile.model_dump() if self.simulated else None,
            "latency_scale": self.latency_scale,
            "task_seed": self.task_seed,
            "max_depth": self.max_depth,
            **({"split": self.split} if self.split else {}),
            **({"base_url": redact(self.base_url)} if self.base_url else {}),
            **({"run_settings": dict(self.run_settings)} if self.run_settings else {}),
            **({"tools": redact_data([e.saved() for e in self.tools])} if self.tools else {}),
            "price": model_price(self.model, self),
            "code": code_version(),
        }

    def provider_options(self) -> dict[str, Any]:
        """Options for a provider model (``base_url``, ``timeout_s``) that were given."""
        options: dict[str, Any] = {"base_url": self.base_url, "timeout_s": self.timeout_s}
        return {k: v for k, v in options.items() if v is not None}


def parse_list(text: str, known: Sequence[str], what: str, one: str) -> tuple[str, ...]:
    """Comma-separated names (``all`` for every one), each checked against ``known``.

    ``what`` names the kind in the plural, ``one`` in the singular (for error messages).
    """
    names = [n.strip() for n in text.split(",") if n.strip()]
    if names == ["all"]:
        return tuple(known)
    if not names:
        raise UserInputError(f"no {what} given: name one or more of {', '.join(known)} (or all)")
    for name in names:
        if name not in known:
            raise UserInputError(f"unknown {one} {name!r}: choose from {', '.join(known)} (or all)")
    return tuple(dict.fromkeys(names))


def check_config(config: BenchConfig) -> None:
    """Raise :class:`UserInputError` with a one-line reason if ``config`` cannot run."""
    chosen = [get_suite(name, config.split) for name in config.suites]
    known = strategy_names()
    for name in config.strategies:
        if name not in known:
            raise UserInputError(f"unknown strategy {name!r}: choose from {', '.join(known)}")
    if not config.suites or not config.strategies:
        raise UserInputError("name at least one suite and one strategy")
    _check_split(config, chosen)
    _check_tasks(config, chosen)
    if not 0 <= config.task_seed <= MAX_TASK_SEED:
        raise UserInputError(f"--task-seed must be 0 to {MAX_TASK_SEED:,} (got {config.task_seed})")
    if config.seeds < 1:
        raise UserInputError(f"--seeds must be at least 1 (got {config.seeds})")
    if config.concurrency < 1:
        raise UserInputError(f"--concurrency must be at least 1 (got {config.concurrency})")
    if not math.isfinite(config.latency_scale) or config.latency_scale < 0:
        raise UserInputError(
            f"--sim-latency-scale must be a finite number >= 0 (got {config.latency_scale})"
        )
    if config.max_depth is not None:
        # Checked here, before the benchmark directory is made, not by each run's settings.
        try:
            RunSettings(max_depth=config.max_depth)
        except ValidationError as exc:
            raise UserInputError(
                f"--max-depth: {exc.errors()[0]['msg']} (got {config.max_depth})"
            ) from None
    parse_model_string(config.model)
    if config.base_url is not None:
        # As for hierplan run: otherwise every call of every run fails to connect, and the
        # benchmark reports them as the model's failures.
        check_base_url(config.base_url)
    if config.simulated and config.provider_options():
        raise UserInputError(SIMULATOR_ONLY)


def _check_split(config: BenchConfig, chosen: Sequence[Suite]) -> None:
    if config.split is not None and not any(s.splits for s in chosen):
        with_splits = [n for n in suite_names() if get_suite(n).splits]
        raise UserInputError(
            f"--split {config.split}: none of the suites run has splits (those with splits: "
            f"{', '.join(with_splits) or 'none'})"
        )


def _check_tasks(config: BenchConfig, chosen: Sequence[Suite]) -> None:
    if config.tasks is None:
        generated = [s.name for s in chosen if s.size() is None]
        if generated:
            raise UserInputError(
                f"--tasks all takes every task of a public set, but {', '.join(generated)} "
                "generates its tasks: give a number"
            )
    elif not 1 <= config.tasks <= MAX_TASK_INDEX + 1:
        raise UserInputError(
            f"--tasks must be 1 to {MAX_TASK_INDEX + 1:,} (got {config.tasks}): a task's id, "
            "which a goals file of hierplan batch names it by, has room for that many"
        )


@dataclass(slots=True, frozen=True)
class BenchRun:
    """One run of the benchmark."""

    suite: Suite
    task: BenchTask
    seed: int
    strategy: str

    @property
    def key(self) -> tuple[str, str, int, str]:
        """Identifies the run in ``results.jsonl``."""
        return (self.suite.name, self.task.task_id, self.seed, self.strategy)

    @property
    def run_id(self) -> str:
        """The run's id (and the name of its directory under ``runs/``)."""
        return f"{self.task.task_id}-s{self.seed}-{self.strategy}"


def strategies_for(suite: Suite, config: BenchConfig) -> tuple[str, ...]:
    """The strategies ``suite`` runs under: its fixed one, else the configured ones."""
    return (suite.fixed_strategy,) if suite.fixed_strategy else config.strategies


def plan_runs(config: BenchConfig) -> list[BenchRun]:
    """Every run, task-major so that paired runs finish close together."""
    specs = []
    for name in config.suites:
        suite = get_suite(name, config.split)
        count = config.tasks if config.tasks is not None else suite.size() or 0
        for task in suite.generate(count, config.task_seed):
            for seed in range(config.seeds):
                for strategy in strategies_for(suite, config):
                    specs.append(BenchRun(suite, task, seed, strategy))
    return specs


def run_settings(spec: BenchRun, config: BenchConfig) -> RunSettings:
    """The settings of one run: its strategy and seed, the configured ones, and those the
    suite's setting fixes (which win)."""
    return RunSettings.model_validate(
        {"strategy": spec.strategy, "seed": simulator_seed(spec.task.task_id, spec.seed)}
        | ({"max_depth": config.max_depth} if config.max_depth is not None else {})
        | dict(config.run_settings)
        | dict(spec.suite.fixed_settings)
    )


class ToolCounter(Instrument):
    """Counts tool calls through the instrument seam (validation failures included)."""

    def __init__(self) -> None:
        self.calls = 0

    def tool_scope(
        self, node: NodeView, call: ToolCall
    ) -> AbstractAsyncContextManager[None] | None:
        """Count the call; no scope needed."""
        self.calls += 1
        return None


@dataclass(slots=True, frozen=True)
class Admission:
    """Whether a run may start (``refused``: why not), and the instruments it runs with."""

    instruments: tuple[Instrument, ...] = ()
    refused: str | None = None


class RunGate(Protocol):
    """Admits each run before it starts, for as long as it runs: a budget shared by the whole
    benchmark grants the run its part (or refuses it a start) and takes back what it did not
    spend when it ends."""

    def admit(
        self, spec: BenchRun, settings: RunSettings, goal: str
    ) -> AbstractAsyncContextManager[Admission]:
        """The run's admission, held while the run runs."""
        ...


async def run_one(
    spec: BenchRun,
    config: BenchConfig,
    model: str | Model,
    *,
    gate: RunGate | None = None,
    out: Path | None = None,
) -> dict[str, Any]:
    """Run one (suite, task, seed, strategy) and verify it; with ``out``, keep its run.json."""
    env = spec.suite.environment(spec.task, latency_scale=config.latency_scale)
    counter = ToolCounter()
    settings = run_settings(spec, config)
    run_spec = RunSpec(
        goal=env.goal,
        model=_bench_model(model, config, spec.suite.oracle()),
        settings=settings,
        price_in=config.price_in,
        price_out=config.price_out,
        run_id=spec.run_id,
        tools=config.tools,
    )
    async with _admitted(gate, spec, settings, env.goal) as admission:
        if admission.refused is not None:
            return not_started_record(spec, config, admission.refused, model)
        result = await execute(
            run_spec, tools=env.tools, instruments=[counter, *admission.instruments]
        )
    verdict = env.verify(result.answer)
    left = env.check_run(result) if env.check_run is not None and verdict.ok else None
    if left is not None:
        verdict = Verification(False, left)
    result.verification = verdict.to_dict()
    record = run_record(spec, result, counter.calls, verdict, config, model)
    if out is not None:
        record["run_json"] = outdir.save_run(out, spec.run_id, result.to_json())
    return record


def _admitted(
    gate: RunGate | None, spec: BenchRun, settings: RunSettings, goal: str
) -> AbstractAsyncContextManager[Admission]:
    if gate is None:
        return _Open()
    return gate.admit(spec, settings, goal)


class _Open:
    """The admission of a run when nothing gates the benchmark."""

    async def __aenter__(self) -> Admission:
        return Admission()

    async def __aexit__(self, *exc: object) -> None:
        return None


def _bench_model(model: str | Model, config: BenchConfig, oracle: Oracle) -> ModelChoice:
    """The model of one run. A simulator is each run's own (one shared by every run would
    draw with one seed for all of them and carry its draw counts from run to run, so that a
    run's noise would depend on the runs before it), on the suite's oracle, seeded by the
    run's settings: a :class:`SimulatedModel` given lends it its profile, priced-as model and
    latency scale."""
    if isinstance(model, SimulatedModel):
        return Simulator(
            profile=model.profile,
            latency_scale=model.latency_scale,
            priced_as=model.priced_as,
            oracle=oracle,
        )
    if isinstance(model, str) and is_simulated(model):
        return Simulator(
            profile=config.profile,
            latency_scale=config.latency_scale,
            priced_as=parse_model_string(model).name or None,
            oracle=oracle,
        )
    return model


Confirm = Callable[[Sequence[BenchRun]], Awaitable[None]]
"""Asked with the runs about to start, before anything is written; raises to refuse them."""


async def run_bench(
    config: BenchConfig,
    out: Path,
    *,
    resume: bool = False,
    model: Model | None = None,
    on_start: Callable[[int, int], None] | None = None,
    on_result: Callable[[dict[str, Any]], None] | None = None,
    confirm: Confirm | None = None,
    gate: RunGate | None = None,
) -> list[dict[str, Any]]:
    """Run the benchmark into ``out``; returns every record (resumed ones included).

    ``model`` replaces the ``config.model`` string (for library use and tests). A
    :class:`SimulatedModel` lends its profile, priced-as model and latency scale to a simulator
    of each run's own, with the suite's oracle and the run's seed, as ``sim`` runs have.
    ``on_start(total, already_done)`` and ``on_result(record)`` report progress; ``confirm``
    sees the runs about to start (a paid benchmark's cost is shown and agreed there);
    ``gate`` admits each run (a budget for the whole benchmark).
    """
    check_config(config)
    owned: Model | None = None
    if model is None and not config.simulated:
        # One client for every run, made before anything is written: a missing key stops here.
        owned = resolve_model(config.model, **config.provider_options())
    try:
        return await _run_all(
            config, out, resume, model or owned, on_start, on_result, confirm, gate
        )
    finally:
        if owned is not None:
            await close_model(owned)


async def _run_all(
    config: BenchConfig,
    out: Path,
    resume: bool,
    model: Model | None,
    on_start: Callable[[int, int], None] | None,
    on_result: Callable[[dict[str, Any]], None] | None,
    confirm: Confirm | None,
    gate: RunGate | None,
) -> list[dict[str, Any]]:
    identity = config.identity()
    if resume:
        previous = outdir.read_for_resume(out, identity)
    else:
        outdir.check_new(out)
        previous = []
    # A run the budget did not start is run again; its old record is superseded.
    records = [r for r in previous if r.get("outcome") != NOT_STARTED]
    done = {(r["suite"], r["task_id"], r["seed"], r["strategy"]) for r in records}
    specs = [s for s in plan_runs(config) if s.key not in done]
    if confirm is not None:
        await confirm(specs)
    if resume:
        outdir.end_with_a_whole_line(out / RESULTS)
    else:
        outdir.start_new(out, identity)
    if on_start is not None:
        on_start(len(specs) + len(done), len(done))
    limiter = anyio.CapacityLimiter(config.concurrency)
    chosen: str | Model = model if model is not None else config.model
    keep = out if config.save_runs else None

    with (out / RESULTS).open("a", encoding="utf-8") as sink:

        async def one(spec: BenchRun) -> None:
            async with limiter:
                record = await _recorded(spec, config, chosen, gate, keep)
            sink.write(_json_line(record))
            sink.flush()
            records.append(record)
            if on_result is not None:
                on_result(record)

        try:
            async with anyio.create_task_group() as tg:
                for spec in specs:
                    tg.start_soon(one, spec)
        except* (UserInputError, ModelAuthError) as group:
            raise group.exceptions[0] from None
    return records


async def _recorded(
    spec: BenchRun,
    config: BenchConfig,
    model: str | Model,
    gate: RunGate | None,
    keep: Path | None,
) -> dict[str, Any]:
    """The record of one run, whatever became of it."""
    try:
        return await run_one(spec, config, model, gate=gate, out=keep)
    except (UserInputError, ModelAuthError):
        raise  # the benchmark cannot go on: say why
    except HierplanError as exc:
        return failed_record(spec, config, exc, model)
    except BaseExceptionGroup as group:
        # A strategy whose steps run in a task group raises what they raised as a group: a
        # run error like any other, as a lone step's would be.
        failure = _run_error(group)
        if failure is None:
            raise
        return failed_record(spec, config, failure, model)


def _json_line(record: Mapping[str, Any]) -> str:
    return json.dumps(record) + "\n"


def _run_error(group: BaseExceptionGroup[Any]) -> HierplanError | None:
    """The first error of ``group`` if every error in it is one a run may end with (a
    :class:`HierplanError` other than bad input or a refused key), else ``None``."""
    run_errors, others = group.split(
        lambda e: (
            isinstance(e, HierplanError) and not isinstance(e, (UserInputError, ModelAuthError))
        )
    )
    if run_errors is None or others is not None:
        return None
    first: BaseException = run_errors
    while isinstance(first, BaseExceptionGroup):
        first = first.exceptions[0]
    return first if isinstance(first, HierplanError) else None


def suites_of(records: Iterable[Mapping[str, Any]]) -> list[str]:
    """The suites present in ``records``, built-in ones first in their order."""
    present = {r["suite"] for r in records}
    order = suite_names()
    return [s for s in order if s in present] + sorted(present - set(order))
