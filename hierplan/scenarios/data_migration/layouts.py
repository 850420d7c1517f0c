"""Plans for the migration that fit a budget, as a careful model would write them.

When a planner's prompt states a budget (see :class:`~hierplan.agents.prompts.PlanBudget`), the
oracle goes through its layouts from the richest to the leanest and writes the first that fits:

1. its usual plan (sub-goals for the schema, each group's rows, the indexes and verification);
2. fewer sub-goals: one sub-goal per group of tables that migrates and verifies the group, with
   the first groups' tools called directly from the root plan instead, one group more at a time;
3. no sub-goal: every tool called directly, an executor verifying each group;
4. the first tables in foreign-key order (parents before children), every tool called directly
   and verification by the tool, as many as fit.

A layout fits when it has no more steps than allowed; when its text, counted at four characters
a token, is within :data:`ANSWER_SHARE` of the answer (the rest is for the reasoning a model
writes first), and that answer within what the prompt allows; and when its sub-goals' planning
calls and its executor tasks' calls, each at the least the prompt says a call costs, are within
what is left after the answer. A sub-goal carries its estimate (its planning call and the
steps it will write), which a budget's ``need`` allocation shares by.
"""

from __future__ import annotations

import json
from collections.abc import Collection, Sequence
from typing import TYPE_CHECKING

from hierplan.agents.prompts import PlanPrompt
from hierplan.models.tokens import estimate_text_tokens
from hierplan.plans.compact import render_step
from hierplan.plans.plan import Plan, Step

if TYPE_CHECKING:
    from hierplan.scenarios.data_migration.oracle import MigrationOracle

ANSWER_SHARE = 0.6
"""The part of the answer it may write that a plan takes at most."""


def root_within_budget(
    oracle: MigrationOracle, steps: list[Step], prompt: PlanPrompt
) -> list[Step]:
    """The root plan under the prompt's budget (see the module docstring)."""
    candidates = [steps]
    if prompt.allow_subgoals:
        groups = len(oracle.groups)
        candidates += [_hybrid(oracle, direct, prompt) for direct in range(groups + 1)]
    candidates.append(oracle.flat_steps())
    return _first_that_fits(candidates + _prefixes(oracle, oracle.tables), prompt)


def sub_within_budget(
    oracle: MigrationOracle,
    kind: str,
    tables: Sequence[str],
    steps: list[Step],
    prompt: PlanPrompt,
) -> list[Step]:
    """A sub-goal's plan under the prompt's budget: its usual plan, verification by the tool
    instead of an executor, or the first of its tables."""
    candidates = [steps]
    if kind == "verify":
        candidates.append([oracle.verify_step(t) for t in tables])
    elif kind in ("migrate", "schema", "copy", "indexes"):
        order = [t for t in oracle.fk_order(oracle.tables) if t in tables]
        candidates += [
            oracle.sub_steps(kind, order[:count]) for count in range(len(order) - 1, 0, -1)
        ]
    return _first_that_fits(candidates, prompt)


def _hybrid(oracle: MigrationOracle, direct: int, prompt: PlanPrompt) -> list[Step]:
    """The first ``direct`` groups' tools called from the root plan, each other group a
    sub-goal that migrates and verifies it, after the groups its tables refer to."""
    steps: list[Step] = []
    done_by: dict[str, list[str]] = {}  # group -> the steps after which its rows are in
    group_parents = oracle.group_parents()
    for index, (name, tables) in enumerate(oracle.groups):
        after = [d for p in group_parents[name] for d in done_by[p]]
        if index < direct:
            own = oracle.direct_steps(tables)
            steps += [
                s.model_copy(update={"depends_on": [*s.depends_on, *after]})
                if s.id.startswith("create_")
                else s
                for s in own
            ]
            done_by[name] = [f"copy_{t}" for t in tables]
            continue
        goal = oracle.instruction("migrate", tables)
        tokens, usd = _subgoal_estimate(oracle.direct_steps(tables), prompt)
        steps.append(
            Step(
                id=f"migrate_{name}",
                title=f"Migrate {name} data",
                instruction=goal,
                kind="subgoal",
                depends_on=after,
                estimate_tokens=tokens,
                estimate_usd=None if usd is None else round(usd, 6),
            )
        )
        done_by[name] = [f"migrate_{name}"]
    return steps


def _subgoal_estimate(steps: list[Step], prompt: PlanPrompt) -> tuple[int, float | None]:
    """What a sub-goal that writes ``steps`` will cost, in tokens and USD (``None`` when the
    prompt states no USD figures): its planning call (as the prompt says one costs at least),
    the plan it writes, with room for reasoning, and its executor tasks' calls."""
    budget = prompt.budget
    answer = int(_text_tokens(steps) / ANSWER_SHARE)
    tasks = sum(1 for s in steps if s.kind == "task" and (s.tool is None or s.args is None))
    if budget is None:
        return answer, None
    tokens = (budget.planning_tokens or 0) + answer + tasks * (budget.executor_tokens or 0)
    if budget.planning_usd is None or budget.answer_usd is None:
        return tokens, None
    usd = budget.planning_usd + answer * budget.answer_usd + tasks * (budget.executor_usd or 0)
    return tokens, usd


def _prefixes(oracle: MigrationOracle, tables: Sequence[str]) -> list[list[Step]]:
    order = [t for t in oracle.fk_order(oracle.tables) if t in tables]
    return [oracle.direct_steps(order[:count]) for count in range(len(order), 0, -1)]


def _text_tokens(steps: Sequence[Step], kept: Collection[str] = ()) -> int:
    """The tokens of ``steps`` as a planner writes them (the compact format), less the
    ``kept`` steps a replan does not write."""
    lines = [
        render_step(step, [s.id for s in steps[:index]])
        for index, step in enumerate(steps)
        if step.id not in kept
    ]
    return estimate_text_tokens("\n".join(lines))


def _fits(steps: Sequence[Step], prompt: PlanPrompt) -> bool:
    budget = prompt.budget
    assert budget is not None
    if len(steps) > prompt.max_steps:
        return False
    # Steps a revised plan keeps from the progress the prompt lists cost nothing more.
    to_run = [s for s in steps if s.id not in prompt.progress]
    subgoals = sum(1 for s in to_run if s.kind == "subgoal")
    tasks = sum(1 for s in to_run if s.kind == "task" and (s.tool is None or s.args is None))
    # The lines it writes, and reasoning before them.
    kept = prompt.carried(Plan(goal=prompt.goal, steps=list(steps)))
    answer = int(_text_tokens(steps, kept) / ANSWER_SHARE)
    return answer <= budget.answer_tokens and budget.fits(subgoals, tasks, answer)


def _first_that_fits(candidates: list[list[Step]], prompt: PlanPrompt) -> list[Step]:
    for candidate in candidates:
        if _fits(candidate, prompt):
            return candidate
    return candidates[-1]


def left_out(oracle: MigrationOracle, tables: Sequence[str], steps: Sequence[Step]) -> str:
    """What a plan of ``steps`` leaves out of migrating ``tables``, for its ``left_out``."""
    text = " ".join(s.instruction for s in steps) + " " + json.dumps([s.args for s in steps])
    missing = [t for t in tables if not _mentions(text, t)]
    if not missing:
        return ""
    return f"tables {', '.join(missing)}: the budget left does not cover them"


def _mentions(text: str, table: str) -> bool:
    return any(
        f"{before}{table}{after}" in text for before in (" ", '"') for after in (",", " ", '"', ":")
    )
