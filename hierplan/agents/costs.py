"""The least a plan can cost, and what a planner is told about its budget.

Under a budget, a step costs at least what its node must be able to reserve to start: a
sub-goal its first planning call, a task for an executor its first executor call (each with
``max_tokens`` lowered to the budget's floor, and its input counted as the budget counts it),
and a direct tool step nothing. A plan's least cost is the sum over the steps still to run. The
gate refuses a plan whose least cost is more than its node has left
(:class:`BudgetCheck`), and the planner's prompt states what is left and what a call costs at
least (:func:`prompt_budget`), so that a planner can write a plan that fits.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING

from hierplan.agents.prompts import (
    PLAN_OUTPUT,
    PlanBudget,
    PlanPrompt,
    StepPrompt,
    one_line,
    render_plan_prompt,
    render_step_prompt,
)
from hierplan.core.spend import NOTHING, Cost, Spending
from hierplan.models.base import Message, ModelRequest, OutputSchema, ToolSpec
from hierplan.plans.plan import Plan, PlanProblem, Step
from hierplan.units import PICO_PER_USD

if TYPE_CHECKING:
    from hierplan.core.views import StepEnv


def planning_request(
    prompt: PlanPrompt,
    tools: Sequence[ToolSpec],
    schema: OutputSchema | None,
    max_tokens: int,
    *,
    path: str = "",
    purpose: str = "plan",
) -> ModelRequest:
    """The request of a planning call for ``prompt``."""
    return ModelRequest(
        messages=render_plan_prompt(prompt, tools),
        output_schema=schema,
        max_tokens=max_tokens,
        phase="planning",
        node_path=path,
        purpose=purpose,
    )


def _child_tools(env: StepEnv, step: Step) -> frozenset[str]:
    allowed = env.allowed_tools
    return allowed if step.tools is None else allowed & frozenset(step.tools)


def least_subgoal_call(
    env: StepEnv, spending: Spending, goal: str, allowed: frozenset[str]
) -> Cost:
    """The least the first planning call of a sub-goal ``goal`` of ``env``'s node costs."""
    settings = env.settings
    prompt = PlanPrompt(
        goal=goal,
        depth=env.depth + 1,
        max_depth=settings.max_depth,
        max_steps=settings.max_steps,
        budget=_placeholder(spending),
    )
    request = planning_request(
        prompt, env.tool_specs(allowed), PLAN_OUTPUT, settings.planner_max_tokens
    )
    return spending.least_call(request)


def least_executor_call(
    env: StepEnv, spending: Spending, instruction: str, allowed: frozenset[str]
) -> Cost:
    """The least the first executor call of a task ``instruction`` of ``env``'s node costs."""
    request = ModelRequest(
        messages=render_step_prompt(StepPrompt(instruction, env.goal)),
        tools=env.tool_specs(allowed),
        max_tokens=env.settings.executor_max_tokens,
        phase="execution",
    )
    return spending.least_call(request)


def least_step_cost(env: StepEnv, spending: Spending, step: Step) -> Cost:
    """The least ``step`` of ``env``'s plan costs (see the module docstring)."""
    allowed = _child_tools(env, step)
    if step.kind == "subgoal":
        return least_subgoal_call(env, spending, step.instruction, allowed)
    if step.tool is not None and step.args is not None:
        return NOTHING
    if step.tool is not None:
        allowed = allowed & frozenset({step.tool})
    return least_executor_call(env, spending, step.instruction, allowed)


class _ExecutorCalls:
    """:func:`least_executor_call` for the task steps of one node's plans, with what their
    first requests share made once: the system message, the context line (the node's goal),
    each tool set's specs; and each (instruction, tools) figured once, for a plan checked
    again after a repair. The same figures, without a prompt rendered per step (a model
    leaf's instructions went from 658,055 to 763,614 when the gate began to figure a step
    prompt per step; benchmarks/instructions.py)."""

    __slots__ = ("context", "env", "known", "max_tokens", "spending", "system", "tools")

    def __init__(self, env: StepEnv, spending: Spending) -> None:
        self.env = env
        self.spending = spending
        # render_step_prompt's messages for a step of this node, but for the step's own line.
        system, user = render_step_prompt(StepPrompt("", env.goal))
        self.system = system
        self.context = user.content[len("STEP: ") :]
        self.max_tokens = env.settings.executor_max_tokens
        self.tools: dict[frozenset[str], tuple[ToolSpec, ...]] = {}
        self.known: dict[tuple[str, frozenset[str]], Cost] = {}

    def least(self, instruction: str, allowed: frozenset[str]) -> Cost:
        """What :func:`least_executor_call` gives for ``instruction`` and ``allowed``."""
        key = (instruction, allowed)
        found = self.known.get(key)
        if found is not None:
            return found
        tools = self.tools.get(allowed)
        if tools is None:
            tools = self.tools[allowed] = self.env.tool_specs(allowed)
        user = Message("user", "STEP: " + one_line(instruction) + self.context)
        request = ModelRequest(
            messages=(self.system, user),
            tools=tools,
            max_tokens=self.max_tokens,
            phase="execution",
        )
        found = self.known[key] = self.spending.least_call(request)
        return found

    def step(self, step: Step) -> Cost:
        """What :func:`least_step_cost` gives for ``step``, a task step."""
        allowed = _child_tools(self.env, step)
        if step.tool is not None:
            if step.args is not None:
                return NOTHING
            allowed = allowed & frozenset({step.tool})
        return self.least(step.instruction, allowed)


class BudgetCheck:
    """The gate's budget check of a node's plans: a plan whose least cost (of the steps not
    ``done``) is more than what the node has left is refused, saying by how much. Keeps the
    least cost of the cheapest plan it refused: what the node would have needed."""

    def __init__(self, env: StepEnv, spending: Spending, done: Collection[str] = ()) -> None:
        self.env = env
        self.spending = spending
        self.done = frozenset(done)
        self.cheapest_refused: Cost | None = None
        self.refused = False
        # The last plan checked and its figures: the plan approved is usually the one the
        # gate just checked, whose step costs the node keeps (a prompt rendered per step).
        self._last: tuple[Plan, tuple[Cost, dict[str, Cost]]] | None = None
        self._executor: _ExecutorCalls | None = None

    def least(self, plan: Plan) -> tuple[Cost, dict[str, Cost]]:
        """The plan's least cost, and each step's (steps already done cost nothing)."""
        last = self._last
        if last is not None and last[0] is plan:
            return last[1]
        figures = self._least(plan)
        self._last = (plan, figures)
        return figures

    def _least(self, plan: Plan) -> tuple[Cost, dict[str, Cost]]:
        total = NOTHING
        steps: dict[str, Cost] = {}
        executor = self._executor
        for step in plan.steps:
            if step.id in self.done:
                continue
            if step.kind == "subgoal":
                cost = least_step_cost(self.env, self.spending, step)
            else:
                if executor is None:
                    executor = self._executor = _ExecutorCalls(self.env, self.spending)
                cost = executor.step(step)
            steps[step.id] = cost
            total = total.plus(cost)
        return total, steps

    def __call__(self, plan: Plan) -> list[PlanProblem]:
        """The budget problem of ``plan``, if it has one."""
        total, steps = self.least(plan)
        over = self.spending.shortfall(total)
        self.refused = over is not None
        if over is None:
            return []
        cheapest = self.cheapest_refused
        if cheapest is None or _dearer(cheapest, total):
            self.cheapest_refused = total
        text = self.spending.text
        subgoals = sum(1 for s in plan.steps if s.kind == "subgoal" and s.id not in self.done)
        tasks = sum(1 for s in plan.steps if steps.get(s.id, NOTHING) != NOTHING) - subgoals
        return [
            PlanProblem(
                "over_budget",
                f"the plan needs at least {text(total)} ({subgoals} sub-goal(s) and {tasks} "
                f"executor task(s); direct tool steps cost nothing) but this node has "
                f"{self.spending.left_text()} left: over by {text(over)}. Write a cheaper plan: "
                "fewer sub-goals, direct tool steps (a tool and its args) instead of sub-goals "
                "or executor tasks, less depth",
            )
        ]


def _dearer(a: Cost, b: Cost) -> bool:
    """Whether ``a`` is more than ``b`` (by USD where both have it, else by tokens)."""
    if a.pico or b.pico:
        return a.pico > b.pico
    return a.tokens > b.tokens


def _placeholder(spending: Spending) -> PlanBudget:
    """A budget line as a sub-goal's prompt will carry one (its figures are not known yet):
    counted in a planning call's least cost, so that the least is not below what is sent."""
    tokens, pico = spending.left
    usd = None if pico is None else pico / PICO_PER_USD
    return PlanBudget(usd, tokens, usd, tokens, usd, tokens, tokens or 10**6)


async def prompt_budget(env: StepEnv, prompt: PlanPrompt, tools: Sequence[ToolSpec]) -> None:
    """State the node's budget in ``prompt`` (when it has one): what is left, what a
    sub-goal's planning call and an executor call cost at least, and the most this planning
    call may write for what is left."""
    spending = await env.spending()
    if spending is None:
        return
    allowed = env.allowed_tools
    planning = least_subgoal_call(env, spending, env.goal, allowed)
    execution = least_executor_call(env, spending, env.goal, allowed)
    tokens, pico = spending.left
    usd = pico is not None and spending.funds.usd_tracked

    def figures(cost: Cost) -> tuple[float | None, int | None]:
        return (cost.pico / PICO_PER_USD if usd else None, None if tokens is None else cost.tokens)

    rate_in, rate_out = spending.funds.planner_rates
    prompt.budget = PlanBudget(
        *figures(Cost(tokens or 0, pico or 0)),
        *figures(planning),
        *figures(execution),
        answer_tokens=env.settings.planner_max_tokens,
        answer_usd=rate_out / PICO_PER_USD if usd else None,
    )
    request = planning_request(prompt, tools, PLAN_OUTPUT, env.settings.planner_max_tokens)
    input_tokens = spending.count_planning(request)
    left_t = None if tokens is None else max(0, tokens - input_tokens)
    left_p = None if pico is None else max(0, pico - input_tokens * rate_in)
    # What the budget lets this call write, not its max_tokens: a reservation lowers
    # max_tokens to what is left, and a provider cuts an answer at max_tokens on its own.
    limits = [] if left_t is None else [left_t]
    if left_p is not None and usd and rate_out:
        limits.append(left_p // rate_out)
    answer = min(limits) if limits else request.max_tokens
    left_usd, left_tokens = figures(Cost(left_t or 0, left_p or 0))
    prompt.budget = replace(
        prompt.budget, left_usd=left_usd, left_tokens=left_tokens, answer_tokens=answer
    )
