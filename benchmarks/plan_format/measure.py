"""The size of parallel_qa's plans in three wire formats: the plan's JSON (what a planner wrote
before the compact format), JSON lines with short keys, and the compact format.

Run from the repository: ``python benchmarks/plan_format/measure.py [tasks] [seed]``. The plans
are the suite oracle's, for a first plan of the task's goal with the suite's tools and sub-goals
allowed (what ``dag`` asks for); tokens are hierplan's estimate (four ASCII characters a token).
"""

from __future__ import annotations

import json
import statistics
import sys
from typing import Any

from hierplan.agents.prompts import PlanPrompt
from hierplan.bench.suites.parallel_qa import ParallelQA
from hierplan.models.tokens import estimate_text_tokens
from hierplan.plans.compact import render_compact, tool_params
from hierplan.plans.plan import Plan, Step


def json_lines(plan: Plan) -> str:
    """One JSON object a step with short keys: i(d), t(ool), a(rgs), d(epends on), x (text),
    k (kind, for a sub-goal)."""
    lines = []
    for s in plan.steps:
        row: dict[str, Any] = {"i": s.id}
        if s.tool is not None:
            row["t"] = s.tool
        if s.args is not None:
            row["a"] = s.args
        else:
            row["x"] = s.instruction
        if s.kind == "subgoal":
            row["k"] = "g"
        if s.depends_on:
            row["d"] = s.depends_on
        lines.append(json.dumps(row, separators=(",", ":")))
    return "\n".join(lines)


def renumbered(plan: Plan) -> Plan:
    """The plan with ids 1, 2, 3..., as a model writing lines numbers them."""
    names = {s.id: str(i) for i, s in enumerate(plan.steps, 1)}

    def ref(value: object) -> object:
        if isinstance(value, str) and value.startswith("$") and value[1:] in names:
            return "$" + names[value[1:]]
        return value

    steps = [
        Step.model_validate(
            {
                **s.model_dump(),
                "id": names[s.id],
                "depends_on": [names[d] for d in s.depends_on],
                "args": None if s.args is None else {k: ref(v) for k, v in s.args.items()},
            }
        )
        for s in plan.steps
    ]
    return plan.model_copy(update={"steps": steps})


def main(count: int = 30, seed: int = 0) -> None:
    """Print mean characters and tokens of each format over ``count`` tasks."""
    suite = ParallelQA()
    oracle = suite.oracle()
    sizes: dict[str, list[int]] = {}
    for task in suite.generate(count, seed):
        tools = suite.environment(task, latency_scale=0).tools
        specs = [t.spec for t in tools]
        params = tool_params(specs)
        prompt = PlanPrompt(goal=task.goal, depth=1, max_depth=3, max_steps=50, tools=tuple(params))
        plan = oracle.plan(prompt)
        assert plan is not None
        texts = {
            "plan JSON (before)": json.dumps(plan.model_dump(mode="json", exclude_none=True)),
            "JSON lines, short keys": json_lines(renumbered(plan)),
            "compact, named args": render_compact(renumbered(plan)),
            "compact, positional args": render_compact(renumbered(plan), params),
        }
        for name, text in texts.items():
            sizes.setdefault(name + " chars", []).append(len(text))
            sizes.setdefault(name + " tokens", []).append(estimate_text_tokens(text))
    for name, values in sizes.items():
        print(f"{name}: mean {statistics.fmean(values):.0f}, max {max(values)}")


if __name__ == "__main__":
    main(
        int(sys.argv[1]) if len(sys.argv) > 1 else 30, int(sys.argv[2]) if len(sys.argv) > 2 else 0
    )
