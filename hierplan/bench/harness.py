"""The benchmark harness: every (suite, task, seed, strategy) as one :func:`hierplan.run`.

Every strategy gets the same tasks, tools, model and settings; only the strategy differs. Runs go
``concurrency`` at a time in one event loop. Each finished run is appended to ``results.jsonl``
at once, so an interrupted benchmark keeps what it did and ``resume`` carries on from there.

A run record holds: success (by the suite's verifier), input and output tokens by role (planner:
planning-phase calls; executor: execution-phase calls), model calls, tool calls, replans, the
depth reached, wall-clock latency and the critical-path bound, and the cost in USD. Records made
with the simulator say so (``simulated: true``).
"""

from __future__ import annotations

import hashlib
import json
import math
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any

import anyio
from pydantic import ValidationError

from hierplan.bench.base import MAX_TASK_INDEX, MAX_TASK_SEED, BenchTask, Suite
from hierplan.bench.suites import SUITE_NAMES, get_suite
from hierplan.core.instrument import Instrument
from hierplan.core.settings import STRATEGY_NAMES, RunSettings
from hierplan.core.views import NodeView
from hierplan.errors import HierplanError, ModelAuthError, UserInputError
from hierplan.files import make_directory, write_atomic
from hierplan.models.base import Model, ToolCall, close_model, parse_model_string
from hierplan.records import RunResult
from hierplan.redact import redact, redact_data
from hierplan.runner.models import SIMULATOR_ONLY, check_base_url, resolve_model
from hierplan.runner.run import execute
from hierplan.runner.spec import ModelChoice, RunSpec, is_simulated
from hierplan.simulator.model import SimulatedModel
from hierplan.simulator.oracle import Oracle
from hierplan.simulator.profiles import PROFILES, NoiseProfile, Simulator
from hierplan.tools.config import ToolsetSpec

RESULTS = "results.jsonl"
MANIFEST = "bench.json"


@dataclass(slots=True, frozen=True)
class BenchConfig:
    """What to run. ``model`` is ``sim`` (the simulator, with ``profile``) or a provider string.

    Tasks are generated from ``task_seed``; seeds ``0 .. seeds-1`` seed the simulator, so each
    task runs ``seeds`` times under every strategy, paired across strategies.
    """

    suites: tuple[str, ...]
    strategies: tuple[str, ...]
    tasks: int
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

    @property
    def simulated(self) -> bool:
        """Whether the model is the offline simulator."""
        return self.model.split(":", 1)[0] == "sim"

    def identity(self) -> dict[str, Any]:
        """What must match for a resumed benchmark to continue this one (``bench.json``), with
        the credentials of a base URL redacted: the file is kept with the results."""
        return {
            "model": self.model,
            "profile": self.profile.model_dump() if self.simulated else None,
            "latency_scale": self.latency_scale,
            "task_seed": self.task_seed,
            "max_depth": self.max_depth,
            **({"base_url": redact(self.base_url)} if self.base_url else {}),
            # Only when given: a benchmark made before --set existed resumes as it was.
            **({"run_settings": dict(self.run_settings)} if self.run_settings else {}),
            **({"tools": redact_data([e.saved() for e in self.tools])} if self.tools else {}),
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
    for name in config.suites:
        get_suite(name)
    for name in config.strategies:
        if name not in STRATEGY_NAMES:
            raise UserInputError(
                f"unknown strategy {name!r}: choose from {', '.join(STRATEGY_NAMES)}"
            )
    if not config.suites or not config.strategies:
        raise UserInputError("name at least one suite and one strategy")
    if not 1 <= config.tasks <= MAX_TASK_INDEX + 1:
        raise UserInputError(
            f"--tasks must be 1 to {MAX_TASK_INDEX + 1:,} (got {config.tasks}): a task's id, "
            "which a goals file of hierplan batch names it by, has room for that many"
        )
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


def plan_runs(config: BenchConfig) -> list[BenchRun]:
    """Every run, task-major so that paired runs finish close together."""
    specs = []
    for name in config.suites:
        suite = get_suite(name)
        for task in suite.generate(config.tasks, config.task_seed):
            for seed in range(config.seeds):
                for strategy in config.strategies:
                    specs.append(BenchRun(suite, task, seed, strategy))
    return specs


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


def run_record(
    spec: BenchRun,
    result: RunResult,
    tool_calls: int,
    success: bool,
    verdict: str,
    config: BenchConfig,
    model: str | Model,
) -> dict[str, Any]:
    """The JSON-ready record of one finished run of ``model``."""
    tokens = {"planning": [0, 0], "execution": [0, 0]}
    calls = replans = 0
    for node in result.nodes():
        for c in node.calls:
            calls += 1
            tokens[c.phase][0] += c.usage.input_tokens
            tokens[c.phase][1] += c.usage.output_tokens
        replans += sum(1 for v in node.plan_versions if v.reason == "replan")
    totals = result.totals()
    bound = spec.task.critical_path_s
    return {
        "suite": spec.suite.name,
        "task": spec.task.index,
        "task_id": spec.task.task_id,
        "seed": spec.seed,
        "sim_seed": simulator_seed(spec.task.task_id, spec.seed),
        "strategy": spec.strategy,
        "model": model_name(model),
        "simulated": result.simulated,
        "profile": noise_profile_name(model, config),
        "success": success,
        "status": result.status,
        "verification": verdict,
        "planner_input_tokens": tokens["planning"][0],
        "planner_output_tokens": tokens["planning"][1],
        "executor_input_tokens": tokens["execution"][0],
        "executor_output_tokens": tokens["execution"][1],
        "tokens": sum(tokens["planning"]) + sum(tokens["execution"]),
        "model_calls": calls,
        "tool_calls": tool_calls,
        "replans": replans,
        "depth": max(n.depth for n in result.nodes()),
        "latency_s": round(result.finished_at - result.started_at, 4),
        "critical_path_s": None if bound is None else round(bound * config.latency_scale, 4),
        # A run with calls of no known price has no known cost (not a cost of 0).
        "cost_usd": None if totals["unpriced_calls"] else totals["cost_usd"],
        "unpriced_calls": totals["unpriced_calls"],
        "params": spec.task.params,
        # An error may quote the URL of a failed request, credentials and all.
        "error": None if result.error is None else redact(result.error),
        "run_id": result.run_id,
    }


def model_name(model: str | Model) -> str:
    """The name records give ``model`` (the model string, or the model's own name)."""
    return model if isinstance(model, str) else model.name


def noise_profile_name(model: str | Model, config: BenchConfig) -> str | None:
    """The simulator noise profile the runs of ``model`` had, ``None`` for any other model.

    Only the simulator applies a profile: a test double is labelled simulated, but no noise
    profile shaped its answers, and a real model's none.
    """
    if isinstance(model, SimulatedModel):
        return model.profile.name
    if isinstance(model, str) and parse_model_string(model).provider == "sim":
        return config.profile.name
    return None


def simulator_seed(task_id: str, seed: int) -> int:
    """The simulator's seed for one task and benchmark seed, the same for every strategy.

    The simulator keys its draws by the asking node's path, which is the same in every task
    (the root is ``1``); seeding each task differently keeps the noise of different tasks
    independent, while runs of one task and seed stay paired across strategies.
    """
    digest = hashlib.sha256(f"{task_id}:{seed}".encode()).digest()
    return int.from_bytes(digest[:4], "big") & 0x7FFFFFFF


async def run_one(spec: BenchRun, config: BenchConfig, model: str | Model) -> dict[str, Any]:
    """Run one (suite, task, seed, strategy) and verify it."""
    env = spec.suite.environment(spec.task, latency_scale=config.latency_scale)
    counter = ToolCounter()
    seed = simulator_seed(spec.task.task_id, spec.seed)
    settings = RunSettings.model_validate(
        {"strategy": spec.strategy, "seed": seed}
        | ({"max_depth": config.max_depth} if config.max_depth is not None else {})
        | dict(config.run_settings)
    )
    run_spec = RunSpec(
        goal=env.goal,
        model=_bench_model(model, config, spec.suite.oracle()),
        settings=settings,
        run_id=f"{spec.task.task_id}-s{spec.seed}-{spec.strategy}",
        tools=config.tools,
    )
    result = await execute(run_spec, tools=env.tools, instruments=[counter])
    verdict = env.verify(result.answer)
    return run_record(spec, result, counter.calls, verdict.ok, verdict.summary, config, model)


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


def load_results(path: Path) -> list[dict[str, Any]]:
    """The records of a ``results.jsonl`` (a torn last line, from an interruption, is skipped)."""
    records = []
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except OSError as exc:
        raise UserInputError(f"cannot read {path}: {exc.strerror or exc}") from None
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:
            if number == len(lines):
                break
            raise UserInputError(f"{path} line {number} is not JSON") from None
    return records


def _prepare_out(config: BenchConfig, out: Path, resume: bool) -> list[dict[str, Any]]:
    results = out / RESULTS
    manifest = out / MANIFEST
    if not resume:
        if results.exists():
            raise UserInputError(
                f"{results} already exists: pass --resume to continue that benchmark, or choose "
                "another --out"
            )
        make_directory(out, "the benchmark directory")
        write_atomic(manifest, json.dumps(config.identity(), indent=1))
        return []
    if not results.exists():
        raise UserInputError(f"nothing to resume: {results} does not exist")
    try:
        # Redacted as identity() is now: a file written before it redacted still matches.
        before = redact_data(json.loads(manifest.read_text(encoding="utf-8")))
    except (OSError, json.JSONDecodeError):
        raise UserInputError(f"cannot resume: {manifest} is missing or unreadable") from None
    now = json.loads(json.dumps(config.identity()))
    if before != now:
        differences = "; ".join(identity_differences(before, now))
        raise UserInputError(
            f"cannot resume {out}: it was made with other settings ({differences}); use the "
            "same ones or another --out"
        )
    records = load_results(results)
    _end_with_a_whole_line(results)
    return records


# The flag that sets each part of a benchmark's identity (see BenchConfig.identity).
IDENTITY_FLAGS: Mapping[str, str] = MappingProxyType(
    {
        "model": "--model",
        "profile": "--sim-profile",
        "latency_scale": "--sim-latency-scale",
        "task_seed": "--task-seed",
        "max_depth": "--max-depth",
        "base_url": "--base-url",
        "run_settings": "--set",
    }
)


def identity_differences(before: Any, now: dict[str, Any]) -> list[str]:
    """Each setting in which ``now`` differs from the recorded identity ``before``, named by
    its flag (and, within the simulator's profile or ``--set``, by its field), with the value
    recorded and the value given."""
    if not isinstance(before, dict):
        return [f"{MANIFEST} holds no settings"]
    found: list[str] = []
    for key in dict.fromkeys([*before, *now]):
        was, given = before.get(key), now.get(key)
        if was == given:
            continue
        flag = IDENTITY_FLAGS.get(key, key)
        if isinstance(was, dict) and isinstance(given, dict):
            for field_name in dict.fromkeys([*was, *given]):
                if was.get(field_name) != given.get(field_name):
                    recorded, asked = _shown(was.get(field_name)), _shown(given.get(field_name))
                    found.append(f"{flag} {field_name}: {recorded} then, {asked} now")
        else:
            found.append(f"{flag}: {_shown(was)} then, {_shown(given)} now")
    return found


def _shown(value: Any) -> str:
    """A recorded value as it reads in a message (``not given`` for none)."""
    return "not given" if value is None or value == {} else json.dumps(value)


def _end_with_a_whole_line(results: Path) -> None:
    """Make ``results`` end with a newline before records are appended to it: a last line an
    interruption left without one is completed if it is a whole record (it was loaded), else
    cut off (it was skipped), so that the next record starts a line of its own."""
    with results.open("rb+") as handle:
        data = handle.read()
        if not data or data.endswith(b"\n"):
            return
        cut = data.rfind(b"\n") + 1
        try:
            json.loads(data[cut:])
        except ValueError:
            handle.truncate(cut)
        else:
            handle.write(b"\n")


async def run_bench(
    config: BenchConfig,
    out: Path,
    *,
    resume: bool = False,
    model: Model | None = None,
    on_start: Callable[[int, int], None] | None = None,
    on_result: Callable[[dict[str, Any]], None] | None = None,
) -> list[dict[str, Any]]:
    """Run the benchmark into ``out``; returns every record (resumed ones included).

    ``model`` replaces the ``config.model`` string (for library use and tests). A
    :class:`SimulatedModel` lends its profile, priced-as model and latency scale to a simulator
    of each run's own, with the suite's oracle and the run's seed, as ``sim`` runs have.
    ``on_start(total, already_done)`` and ``on_result(record)`` report progress.
    """
    check_config(config)
    owned: Model | None = None
    if model is None and not config.simulated:
        # One client for every run, made before anything is written: a missing key stops here.
        owned = resolve_model(config.model, **config.provider_options())
    try:
        return await _run_all(config, out, resume, model or owned, on_start, on_result)
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
) -> list[dict[str, Any]]:
    previous = _prepare_out(config, out, resume)
    done = {(r["suite"], r["task_id"], r["seed"], r["strategy"]) for r in previous}
    specs = [s for s in plan_runs(config) if s.key not in done]
    if on_start is not None:
        on_start(len(specs) + len(done), len(done))
    records = list(previous)
    limiter = anyio.CapacityLimiter(config.concurrency)
    chosen: str | Model = model if model is not None else config.model

    with (out / RESULTS).open("a", encoding="utf-8") as sink:

        async def one(spec: BenchRun) -> None:
            async with limiter:
                try:
                    record = await run_one(spec, config, chosen)
                except (UserInputError, ModelAuthError):
                    raise  # the benchmark cannot go on: say why
                except HierplanError as exc:
                    record = _failed_record(spec, config, exc, chosen)
                except BaseExceptionGroup as group:
                    # A strategy whose steps run in a task group raises what they raised as a
                    # group: a run error like any other, as a lone step's would be.
                    failure = _run_error(group)
                    if failure is None:
                        raise
                    record = _failed_record(spec, config, failure, chosen)
            sink.write(json.dumps(record) + "\n")
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


def _failed_record(
    spec: BenchRun, config: BenchConfig, exc: Exception, model: str | Model
) -> dict[str, Any]:
    """A run of ``model`` that raised instead of returning a result (counted as a failure);
    it names the model the runs used, which ``run_bench(model=...)`` may give instead of the
    configured one."""
    return {
        "suite": spec.suite.name,
        "task": spec.task.index,
        "task_id": spec.task.task_id,
        "seed": spec.seed,
        "strategy": spec.strategy,
        "model": model_name(model),
        "simulated": model.simulated if not isinstance(model, str) else config.simulated,
        "profile": noise_profile_name(model, config),
        "success": False,
        "status": "error",
        "verification": "",
        "params": spec.task.params,
        "error": redact(f"{type(exc).__name__}: {exc}"),
        "finished_at": time.time(),
    }


def suites_of(records: Iterable[Mapping[str, Any]]) -> list[str]:
    """The suites present in ``records``, in the built-in order."""
    present = {r["suite"] for r in records}
    return [s for s in SUITE_NAMES if s in present] + sorted(present - set(SUITE_NAMES))
