"""The gate's least cost of a plan: figured with what its steps' requests share made once, and
the same figures, step by step, as :func:`least_step_cost` renders each step's prompt."""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import partial

import pytest

from hierplan import Approve, CallbackApprover
from hierplan.agents.costs import BudgetCheck, least_step_cost
from hierplan.core.settings import RunSettings
from hierplan.core.spend import NOTHING, Cost, Funds, Spending
from hierplan.hierarchy.gate import Gate, GateContext
from hierplan.models.base import ToolSpec
from hierplan.models.counting import ExactCounter, InputCounter, bound_input_tokens
from hierplan.models.tokens import estimate_input_tokens
from hierplan.plans.plan import Plan, Step
from hierplan.tools.base import Tool, Toolbox, tool


def _tools() -> list[Tool]:
    def read_rows(table: str, limit: int = 10) -> str:
        """Read rows of a table."""
        return table

    def write_rows(table: str, rows: list[str]) -> int:
        """Write rows to a table, in one transaction; returns how many were written."""
        return len(rows)

    def search(query: str) -> list[str]:
        """Search the documents."""
        return [query]

    return [tool(read_rows), tool(write_rows), tool(search)]


@dataclass
class _Env:
    """The parts of a node a budget check reads."""

    goal: str
    toolbox: Toolbox
    allowed_tools: frozenset[str]
    depth: int = 1
    settings: RunSettings = field(default_factory=RunSettings)

    def tool_specs(self, allowed: frozenset[str] | None = None) -> tuple[ToolSpec, ...]:
        return self.toolbox.specs(self.allowed_tools if allowed is None else allowed)


class _Encoding:
    """A stand-in tokenizer: one token per word."""

    def encode(self, text: str, *, disallowed_special: object = ()) -> list[int]:
        return [0] * len(text.split())


def _spending(counter: InputCounter) -> Spending:
    funds = Funds(
        tokens=10_000,
        pico=10**9,
        usd_tracked=True,
        planner_rates=(2, 9),
        executor_rates=(3, 11),
        min_output_fraction=0.125,
    )
    count = partial(counter, model=None)
    return Spending(funds, count, count)


def _plan() -> Plan:
    def task(i: int, instruction: str, **extra: object) -> Step:
        return Step(id=f"t{i}", title=f"step {i}", instruction=instruction, **extra)

    return Plan(
        goal="move the orders table",
        steps=[
            task(1, "read the orders"),
            task(2, "read   the\norders  again, with a limit"),  # whitespace made one space
            task(3, "write the rows", tools=["write_rows"]),
            task(4, "search for the schema", tool="search"),  # a tool, the model fills args
            task(5, "read it directly", tool="read_rows", args={"table": "orders"}),
            task(6, "read the orders"),  # the same instruction as t1
            task(7, "search the docs", tools=["search", "read_rows"]),
            Step(id="g1", title="sub", instruction="plan the rest", kind="subgoal"),
            task(8, "ünïcode instruction: naïve café"),
            task(9, "already done"),
            task(10, "read the orders", tools=["search"]),  # t1's instruction, other tools
        ],
    )


@pytest.mark.parametrize(
    "counter",
    [estimate_input_tokens, bound_input_tokens, ExactCounter("gpt-4o", lambda _: _Encoding())],
    ids=["estimate", "bound", "exact"],
)
@pytest.mark.parametrize("goal", ["move the orders table", "  spaced\n goal  ", ""])
def test_least_costs_are_those_of_each_step_prompt_rendered(
    counter: InputCounter, goal: str
) -> None:
    toolbox = Toolbox(_tools())
    env = _Env(goal, toolbox, frozenset({"read_rows", "write_rows", "search"}))
    spending = _spending(counter)
    plan = _plan()
    check = BudgetCheck(env, spending, done={"t9"})  # type: ignore[arg-type]
    total, steps = check.least(plan)
    expected = {
        s.id: least_step_cost(env, spending, s)  # type: ignore[arg-type]
        for s in plan.steps
        if s.id != "t9"
    }
    assert steps == expected
    assert total == Cost(
        sum(c.tokens for c in expected.values()), sum(c.pico for c in expected.values())
    )
    assert steps["t5"] == NOTHING  # a direct tool step
    # Different tool sets and instructions give different figures: the cache keys on both.
    assert len({steps["t1"], steps["t3"], steps["t4"], steps["t7"]}) == 4
    assert steps["t1"] == steps["t6"] != steps["t10"]
    # A second plan (a repair) is figured the same way, with what the first one made kept.
    repaired = Plan(goal=plan.goal, steps=[*plan.steps[:3], _plan().steps[7]])
    again_total, again = check.least(repaired)
    assert again == {s.id: expected[s.id] for s in repaired.steps}
    assert again_total == Cost(
        sum(c.tokens for c in again.values()), sum(c.pico for c in again.values())
    )


@pytest.mark.anyio
async def test_steps_an_approver_added_in_place_are_costed_before_they_run() -> None:
    toolbox = Toolbox(_tools())
    allowed = frozenset({"read_rows", "write_rows", "search"})
    env = _Env("g", toolbox, allowed)
    count = partial(estimate_input_tokens, model=None)
    funds = Funds(
        tokens=50,  # enough for a direct tool step, not for a model call
        pico=None,
        usd_tracked=False,
        planner_rates=(2, 9),
        executor_rates=(3, 11),
        min_output_fraction=0.125,
    )
    check = BudgetCheck(env, Spending(funds, count, count))  # type: ignore[arg-type]
    direct = Step(id="a", title="a", instruction="read", tool="read_rows", args={"table": "t"})
    seen: list[tuple[str, ...]] = []

    def review(plan: Plan, context: GateContext) -> Approve:
        seen.append(context.problems)
        if len(seen) == 1:
            plan.steps.append(Step(id="b", title="b", instruction="plan the rest", kind="subgoal"))
        return Approve(by="erin")

    context = GateContext(
        path="1", goal="g", depth=1, max_depth=3, max_steps=50, allowed_tools=allowed,
        toolbox=toolbox, version=1, reason="initial", budget_check=check,
    )  # fmt: skip
    plan = Plan(goal="g", steps=[direct])
    outcome = await Gate(CallbackApprover(review)).review(plan, context)
    assert (outcome.kind, outcome.plan) == ("approved", Plan(goal="g", steps=[direct]))
    [refused] = outcome.refused
    assert [s.id for s in refused.plan.steps] == ["a", "b"]
    assert seen[0] == () and "has 50 tokens left" in seen[1][0]
    # The node keeps its steps' least costs from the check: they are the plan's that runs.
    fresh = BudgetCheck(env, Spending(funds, count, count))  # type: ignore[arg-type]
    assert check.least(outcome.plan) == fresh.least(outcome.plan)
