"""What a run needs before its nodes start: its tools and a scenario's world set up, its
budget instrument, and its context."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

import anyio.to_thread

from hierplan.budgets.budget import DEFAULT_ALLOCATION
from hierplan.budgets.instrument import BudgetInstrument, prepare_budget
from hierplan.core.events import EventBus, Listener
from hierplan.core.instrument import Instrument
from hierplan.core.settings import RunSettings
from hierplan.durable.restore import Restore
from hierplan.errors import UserInputError
from hierplan.files import make_directory
from hierplan.hierarchy.context import RunContext
from hierplan.hierarchy.gate import Approver, Gate
from hierplan.models.base import Model
from hierplan.models.counting import InputCounter, Reservation, input_counter
from hierplan.pricing import PriceTable
from hierplan.runner.models import priced_as_of
from hierplan.runner.spec import RunSpec, is_simulated
from hierplan.scenarios import ScenarioEnv, get_scenario
from hierplan.simulator.oracle import COVERAGE_HINT, Oracle
from hierplan.simulator.profiles import Simulator
from hierplan.tools.base import Tool, Toolbox, Toolset


@dataclass(slots=True, frozen=True)
class OpenableToolset:
    """A toolset the run opens, named by where it came from (``label``) in its errors, which
    ``hide`` rids of the values of its ``${VAR}``."""

    label: str
    toolset: Toolset
    hide: Callable[[str], str] = str


@dataclass(slots=True)
class Prepared:
    """A run's goal, tools and oracle, and the scenario's world when it runs one. ``sources``
    names where each of ``tools`` came from; the tools of ``toolsets`` join them when the run
    opens those."""

    goal: str
    tools: list[Tool]
    oracle: Oracle | None
    env: ScenarioEnv | None
    scenario: str | None
    workdir: Path | None = None
    toolsets: list[OpenableToolset] = field(default_factory=list)
    sources: dict[str, str] = field(default_factory=dict)

    def add_source(self, name: str, label: str) -> None:
        """Note that the tool ``name`` comes from ``label``; two tools of one name are refused,
        naming where each came from."""
        if name in self.sources:
            raise UserInputError(
                f"two tools are named {name!r}: one from {self.sources[name]}, one from "
                f"{label}; give one a tool_prefix (mcp: {{..., tool_prefix: 'x_'}}), or keep "
                "only the tools needed (include: [...])"
            )
        self.sources[name] = label


def refuse_own_goal_for_simulated_scenario(spec: RunSpec) -> None:
    """A scenario's oracle knows the scenario's own goal only: on the simulator, another goal
    text could never be planned, so it is refused before the scenario is set up."""
    model = spec.model
    oracle = model.oracle if isinstance(model, Simulator) else None
    if spec.scenario is None or not spec.goal or not spec.goal.strip() or oracle is not None:
        return
    if is_simulated(model):
        raise UserInputError(
            "a goal and a scenario were both given, but the simulator knows only the scenario's "
            "own goal: leave the goal out, or give the goal text with a real model "
            "(--model openai:<model> or anthropic:<model>) on the scenario's tools"
        )


async def prepare(
    spec: RunSpec, tools: Iterable[Tool | Toolset], run_id: str, *, reopen: bool = False
) -> Prepared:
    """The run's tools, and its scenario's world set up (``reopen``: as a paused run left it)."""
    goal = None if spec.goal is None else spec.goal.strip()
    oracle = spec.model.oracle if isinstance(spec.model, Simulator) else None
    if spec.scenario is None:
        assert goal  # RunSpec.checked
        return _with_tools(Prepared(goal, [], oracle, None, None), spec, tools)
    found = get_scenario(spec.scenario) if isinstance(spec.scenario, str) else spec.scenario
    # One directory per run: concurrent runs of a scenario must not share its files.
    where = spec.workdir or Path("runs") / "scenarios" / found.name / run_id
    make_directory(where, "the run directory")
    make_env = found.reopen if reopen else found.setup
    env = await anyio.to_thread.run_sync(partial(make_env, where, seed=spec.settings.seed))
    prepared = Prepared(goal or env.goal, [], oracle or env.oracle, env, found.name, where)
    _add_tools(prepared, env.tools, f"the scenario {found.name}")
    return _with_tools(prepared, spec, tools)


def _with_tools(prepared: Prepared, spec: RunSpec, tools: Iterable[Tool | Toolset]) -> Prepared:
    """``prepared`` with the tools and toolsets given as objects and those of the spec's
    ``tools`` entries (their ``${VAR}`` read now)."""
    given = list(tools)
    wrong = [item for item in given if not isinstance(item, Tool | Toolset)]
    if wrong:
        raise UserInputError(
            f"tools= takes hierplan tools (@hierplan.tool) and toolsets (MCP servers), "
            f"not {type(wrong[0]).__name__}"
        )
    _add_tools(prepared, given, "tools=")
    environ = dict(os.environ)
    for index, entry in enumerate(spec.tools, 1):
        _add_tools(
            prepared,
            entry.toolset(environ),
            entry.named(index),
            partial(entry.hidden, environ=environ),
        )
    return prepared


def _add_tools(
    prepared: Prepared,
    items: Iterable[Tool | Toolset],
    label: str,
    hide: Callable[[str], str] = str,
) -> None:
    for item in items:
        if isinstance(item, Toolset):
            shown = getattr(item, "shown", None) or item.name
            name = label if label != "tools=" else f"the toolset {shown} (tools=)"
            name = getattr(item, "label", None) or name  # a batch's shared server: its entry
            prepared.toolsets.append(OpenableToolset(name, item, hide))
        else:
            prepared.add_source(item.name, label if label != "tools=" else "tools=")
            prepared.tools.append(item)


def with_budget(
    spec: RunSpec, pricing: PriceTable, instruments: Sequence[Instrument]
) -> Sequence[Instrument]:
    """The run's instruments, with a budget instrument added when the spec has a budget
    (checked before anything runs: bad values, and an unknown price under a USD budget)."""
    executor = spec.model if spec.executor_model is None else spec.executor_model
    budget = spec.budget
    budgeting = prepare_budget(
        budget_usd=None if budget is None else budget.usd,
        budget_tokens=None if budget is None else budget.tokens,
        allocation=DEFAULT_ALLOCATION if budget is None else budget.allocation,
        reservation="exact" if budget is None else budget.reservation,
        pricing=pricing,
        models=[priced_as_of(spec.model), priced_as_of(executor)],
    )
    given = sum(isinstance(i, BudgetInstrument) for i in instruments)
    if budgeting is not None and given:
        # Two budgets would both cut the run, and the record would show only one of them.
        raise UserInputError(
            "the run has two budgets: give budget= or a BudgetInstrument in instruments, not both"
        )
    if given > 1:
        raise UserInputError(
            f"instruments holds {given} BudgetInstruments: a run takes one budget (put both "
            "caps in one Budget(tokens=..., usd=...))"
        )
    return instruments if budgeting is None else [*instruments, budgeting]


def run_context(
    models: tuple[Model, Model | None],
    prepared: Prepared,
    run_id: str,
    settings: RunSettings,
    pricing: PriceTable,
    instruments: Sequence[Instrument],
    listeners: Sequence[Listener],
    gate: Gate,
    restore: Restore | None,
) -> RunContext:
    """The run's context; a free-text goal for the simulator is refused here."""
    planner_model, executor_model = models
    if planner_model.provider == "sim" and prepared.oracle is None:
        raise UserInputError(f"the goal {prepared.goal[:120]!r} is free text. {COVERAGE_HINT}")
    bus = EventBus(run_id)
    for listener in listeners:
        bus.subscribe(listener)
    ctx = RunContext(
        run_id=run_id,
        settings=settings,
        toolbox=Toolbox(prepared.tools),
        planner_model=planner_model,
        executor_model=planner_model if executor_model is None else executor_model,
        pricing=pricing,
        instruments=instruments,
        bus=bus,
        gate=gate,
        restore=restore,
    )
    budget = next((i for i in instruments if isinstance(i, BudgetInstrument)), None)
    if budget is not None:
        ctx.counters = (
            _counter(budget.reservation, ctx.planner_model),
            _counter(budget.reservation, ctx.executor_model),
        )
    return ctx


def _counter(reservation: Reservation, model: Model) -> InputCounter:
    """How a budget of ``reservation`` counts the input of calls to ``model``."""
    return input_counter(
        reservation,
        model.provider,
        model.name.partition(":")[2],
        custom_server=bool(getattr(model, "base_url", None)),
    )


def run_gate(spec: RunSpec, approver: Approver | None) -> Gate:
    """The run's gate: the spec's, or the default validators with ``approver``."""
    if spec.gate is None:
        return Gate(approver)
    if approver is not None:
        raise UserInputError(
            "the run has a gate and an approver: give the approver to the Gate, or approver=, "
            "not both"
        )
    return spec.gate
