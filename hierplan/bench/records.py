"""The records of a benchmark's runs: one flat JSON object a run, one line of ``results.jsonl``.

Every value is a number, a string, a boolean or ``null``, so that ``results.jsonl`` loads into
a data frame as it is (``pandas.read_json(path, lines=True)``): a task's parameters are columns
``param_<name>``, the simulator's knobs ``sim_<knob>``, the model's price ``price_*``.

A run's **outcome** separates what the verifier found from what the agent reported:

- ``success``: the goal was reached and the agent reported success;
- ``goal_reached_gave_up``: the goal was reached, but the agent gave up (its run failed):
  a failure by default (``hierplan bench --count-gave-up`` counts it as a success);
- ``claimed_success``: the agent reported success, but the goal was not reached;
- ``failed``: the agent gave up and the goal was not reached;
- ``error``: the run raised instead of ending (a failure; its usage is unknown);
- ``not_started_budget``: the bench's budget could not grant the run a start; left out of
  every figure (it is not a failure), and run again by ``--resume``.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

from hierplan.bench.provenance import code_version, price_of
from hierplan.models.base import Model
from hierplan.pricing import PriceTable
from hierplan.records import RunResult
from hierplan.redact import redact
from hierplan.runner.models import priced_as_of, with_price
from hierplan.scenarios.base import Verification
from hierplan.simulator.model import SimulatedModel

if TYPE_CHECKING:
    from hierplan.bench.harness import BenchConfig, BenchRun

OUTCOMES: tuple[str, ...] = (
    "success",
    "goal_reached_gave_up",
    "claimed_success",
    "failed",
    "error",
    "not_started_budget",
)
NOT_STARTED = "not_started_budget"


def outcome_of(goal_reached: bool, status: str) -> str:
    """The outcome of a run that ended with ``status``, its goal reached or not."""
    if goal_reached:
        return "success" if status == "succeeded" else "goal_reached_gave_up"
    return "claimed_success" if status == "succeeded" else "failed"


def counts_as_success(record: Mapping[str, Any], count_gave_up: bool = False) -> bool:
    """Whether a record is a success: its outcome is ``success`` (or, with
    ``count_gave_up``, ``goal_reached_gave_up``). A record written before outcomes were
    recorded has its ``success`` field."""
    outcome = record.get("outcome")
    if outcome is None:
        return bool(record.get("success"))
    return outcome == "success" or (count_gave_up and outcome == "goal_reached_gave_up")


def started(record: Mapping[str, Any]) -> bool:
    """Whether the run started (a run the budget could not start is in no figure)."""
    return record.get("outcome") != NOT_STARTED


def run_key(record: Mapping[str, Any]) -> tuple[Any, ...]:
    """What identifies a run in ``results.jsonl``."""
    return (record["suite"], record["task_id"], record["seed"], record["strategy"])


def latest_records(records: Iterable[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """One record a run, the last written (a run the budget skipped may run on a resume)."""
    found: dict[tuple[Any, ...], Mapping[str, Any]] = {}
    for record in records:
        found.pop(run_key(record), None)
        found[run_key(record)] = record
    return list(found.values())


def model_name(model: str | Model) -> str:
    """The name records give ``model`` (the model string, or the model's own name)."""
    return model if isinstance(model, str) else model.name


def noise_profile(model: str | Model, config: BenchConfig) -> dict[str, Any] | None:
    """The simulator noise profile (every knob) the runs of ``model`` had, ``None`` for any
    other model: a test double is labelled simulated, but no noise profile shaped its
    answers, and a real model's none."""
    if isinstance(model, SimulatedModel):
        return model.profile.model_dump()
    if isinstance(model, str) and model.split(":", 1)[0] == "sim":
        return config.profile.model_dump()
    return None


def simulator_seed(task_id: str, seed: int) -> int:
    """The simulator's seed for one task and benchmark seed, the same for every strategy.

    The simulator keys its draws by the asking node's path, which is the same in every task
    (the root is ``1``); seeding each task differently keeps the noise of different tasks
    independent, while runs of one task and seed stay paired across strategies.
    """
    digest = hashlib.sha256(f"{task_id}:{seed}".encode()).digest()
    return int.from_bytes(digest[:4], "big") & 0x7FFFFFFF


def _flat(prefix: str, values: Mapping[str, Any]) -> dict[str, Any]:
    """``values`` as columns ``<prefix><key>``; a value that is not a scalar as its text."""
    out: dict[str, Any] = {}
    for key, value in values.items():
        scalar = value is None or isinstance(value, bool | int | float | str)
        out[f"{prefix}{key}"] = value if scalar else str(value)
    return out


def base_record(spec: BenchRun, config: BenchConfig, model: str | Model) -> dict[str, Any]:
    """What every record of ``spec`` holds, whatever became of the run: the task as the
    suite names it, the model and its price, the simulator's knobs, and the code's version."""
    profile = noise_profile(model, config)
    simulated = model.simulated if not isinstance(model, str) else config.simulated
    record: dict[str, Any] = {
        "suite": spec.suite.name,
        "split": spec.suite.split,
        "task": spec.task.index,
        "task_id": spec.task.task_id,
        "task_name": spec.task.display_name,
        "seed": spec.seed,
        "sim_seed": simulator_seed(spec.task.task_id, spec.seed),
        "strategy": spec.strategy,
        "model": model_name(model),
        "simulated": simulated,
        "profile": None if profile is None else profile.get("name"),
        "latency_scale": config.latency_scale,
        # At scale 0 nothing simulated takes time: a latency is the CPU time of the run.
        "latency_cpu_only": bool(simulated and config.latency_scale == 0),
    }
    record |= _flat("sim_", {k: v for k, v in (profile or {}).items() if k != "name"})
    record |= code_version()
    record |= model_price(model, config)
    record |= _flat("param_", spec.task.params)
    return record


def model_price(model: str | Model, config: BenchConfig) -> dict[str, Any]:
    """The price the runs of ``model`` are charged at (``--price-in``/``--price-out`` win)."""
    priced = priced_as_of(model)
    table = with_price(PriceTable(), config.price_in, config.price_out, [priced])
    return price_of(priced, table)


def run_record(
    spec: BenchRun,
    result: RunResult,
    tool_calls: int,
    verdict: Verification,
    config: BenchConfig,
    model: str | Model,
) -> dict[str, Any]:
    """The record of one finished run of ``model``, checked by ``verdict``."""
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
    outcome = outcome_of(verdict.ok, result.status)
    return base_record(spec, config, model) | {
        "success": outcome == "success",
        "outcome": outcome,
        "goal_reached": verdict.ok,
        "agent_succeeded": result.status == "succeeded",
        "status": result.status,
        "verification": verdict.summary,
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
        # An error may quote the URL of a failed request, credentials and all.
        "error": None if result.error is None else redact(result.error),
        "run_id": result.run_id,
        "run_json": None,
        "finished_at": time.time(),
    }


def failed_record(
    spec: BenchRun, config: BenchConfig, exc: Exception, model: str | Model
) -> dict[str, Any]:
    """A run of ``model`` that raised instead of returning a result (a failure whose usage is
    unknown); it names the model the runs used, which ``run_bench(model=...)`` may give."""
    return base_record(spec, config, model) | {
        "success": False,
        "outcome": "error",
        "goal_reached": None,
        "agent_succeeded": False,
        "status": "error",
        "verification": "",
        "error": redact(f"{type(exc).__name__}: {exc}"),
        "finished_at": time.time(),
    }


def not_started_record(
    spec: BenchRun, config: BenchConfig, reason: str, model: str | Model
) -> dict[str, Any]:
    """A run the bench's budget could not start: recorded as such, not as a failure."""
    return base_record(spec, config, model) | {
        "success": False,
        "outcome": NOT_STARTED,
        "goal_reached": None,
        "agent_succeeded": None,
        "status": "not_started",
        "verification": "",
        "error": reason,
        "finished_at": time.time(),
    }
