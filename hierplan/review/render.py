"""What a reviewer sees: the plan as a tree of parallel waves, and what changed since the last one.

Everything a model or a person wrote (goals, titles, arguments) is rendered as text, never as
rich markup.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from rich.console import Group, RenderableType
from rich.text import Text
from rich.tree import Tree

from hierplan.hierarchy.gate import GateContext
from hierplan.plans.plan import Plan, Step, diff_plans, topological_order
from hierplan.review.policy import destructive_tools
from hierplan.tools.base import ToolHints
from hierplan.view.tree import LISTED_IDS, data_text, id_list, money, plain, short

COMPARED = (
    "title",
    "instruction",
    "kind",
    "depends_on",
    "tool",
    "args",
    "tools",
    "estimate_usd",
    "estimate_tokens",
)


def waves(plan: Plan) -> list[list[Step]]:
    """Steps grouped by how early they can start: wave 1 needs nothing, wave n waits for n-1."""
    level: dict[str, int] = {}
    steps = plan.step_map()
    for step_id in topological_order(plan):
        deps = [level[d] for d in steps[step_id].depends_on if d in level]
        level[step_id] = 1 + max(deps, default=0)
    out: list[list[Step]] = [[] for _ in range(max(level.values(), default=0))]
    for step in plan.steps:
        out[level[step.id] - 1].append(step)
    return out


def estimate_text(step: Step) -> str:
    """The planner's cost estimate of a step, e.g. ``est. $0.0100, 5,500 tok``."""
    parts = []
    if step.estimate_usd is not None:
        parts.append(money(step.estimate_usd))
    if step.estimate_tokens is not None:
        parts.append(f"{step.estimate_tokens:,} tok")
    return "est. " + ", ".join(parts) if parts else ""


def step_label(step: Step, hints: Mapping[str, ToolHints] | None = None) -> Text:
    """One step: id, kind, title, tool and args, dependencies, budget estimate; with the
    run's tools' ``hints``, what the step's tools say they do (``[read-only]``,
    ``[destructive]``)."""
    hints = hints or {}
    label = Text()
    label.append(plain(step.id), style="bold")
    label.append(f" [{step.kind}] ", style="dim")
    label.append(short(step.title, 60))
    if step.tool:
        label.append(f"  tool={short(step.tool, 66)}", style="blue")
        _hint(label, hints.get(step.tool))
        if step.args is not None:
            label.append(f" {data_text(step.args, 50)}", style="blue")
    if step.tools is not None:
        label.append("  tools: ", style="blue")
        label.append("none" if not step.tools else "", style="blue")
        for index, name in enumerate(step.tools[:LISTED_IDS]):
            label.append(f"{', ' if index else ''}{short(name, 66)}", style="blue")
            _hint(label, hints.get(name))
        more = len(step.tools) - LISTED_IDS
        if more > 0:
            label.append(f" and {more:,} more", style="blue")
    if step.depends_on:
        label.append(f"  after {id_list(step.depends_on)}", style="dim")
    estimate = estimate_text(step)
    if step.kind == "subgoal" and not estimate:
        estimate = "budget: no estimate"
    if estimate:
        label.append(f"  {estimate}", style="magenta")
    return label


def _hint(label: Text, hints: ToolHints | None) -> None:
    shown = "" if hints is None else hints.label()
    if shown:
        label.append(f" [{shown}]", style="bold red" if shown == "destructive" else "green")


def tool_hints(ctx: GateContext) -> dict[str, ToolHints]:
    """The hints of the tools the node in ``ctx`` may use, by name."""
    return {tool.name: tool.hints for tool in ctx.toolbox if tool.name in ctx.allowed_tools}


def plan_review_tree(
    plan: Plan, *, title: str, hints: Mapping[str, ToolHints] | None = None
) -> Tree:
    """The plan as a tree: waves of steps that can run in parallel, each step with its details
    (its tools marked with their ``hints``)."""
    tree = Tree(Text(f"{title}: {short(plan.goal, 90)}", style="bold"))
    try:
        groups = waves(plan)
    except ValueError:  # a cycle: show the steps in plan order
        groups = [list(plan.steps)]
    for number, group in enumerate(groups, 1):
        parallel = f" ({len(group)} in parallel)" if len(group) > 1 else ""
        branch = tree.add(Text(f"wave {number}{parallel}", style="cyan"))
        for step in group:
            branch.add(step_label(step, hints))
    if plan.rationale:
        tree.add(Text(f"why: {short(plan.rationale, 200)}", style="dim italic"))
    return tree


def diff_view(old: Plan, new: Plan, hints: Mapping[str, ToolHints] | None = None) -> Text:
    """Steps added, removed and changed from ``old`` to ``new``, one line each.

    The diff is taken here, between the two plans shown: a diff recorded with a plan version
    may be against another version (a refused edit, the edited plan that ran), and would name
    steps that neither plan has.
    """
    diff = diff_plans(old, new)
    text = Text()
    text.append(f"changes: {plain(diff.summary())}\n", style="bold")
    before, after = old.step_map(), new.step_map()
    for step_id in diff.added:
        text.append("  + ", style="green bold")
        text.append_text(step_label(after[step_id], hints))
        text.append("\n")
    for step_id in diff.removed:
        text.append("  - ", style="red bold")
        text.append(
            f"{plain(step_id)} [{before[step_id].kind}] {short(before[step_id].title, 60)}\n"
        )
    for step_id in diff.changed:
        a, b = before[step_id], after[step_id]
        fields = [
            f"{name}: {data_text(getattr(a, name))} → {data_text(getattr(b, name))}"
            for name in COMPARED
            if getattr(a, name) != getattr(b, name)
        ]
        text.append("  ~ ", style="yellow bold")
        text.append(f"{plain(step_id)}: {'; '.join(fields)}\n")
    if diff.empty:
        text.append("  the steps are the same as before\n", style="dim")
    return text


def budget_text(budget: dict[str, Any] | None) -> str:
    """A node's budget record on one line."""
    if not budget:
        return ""
    return ", ".join(f"{k} {v}" for k, v in budget.items() if v is not None)


def review_view(plan: Plan, ctx: GateContext, *, rejected: str | None = None) -> RenderableType:
    """Everything shown before the question: header, diff (after a replan), the plan tree."""
    where = "root" if ctx.is_root else f"depth {ctx.depth}"
    head = Text()
    head.append(f"Review: plan for node {ctx.path} ({where}), version {ctx.version}", style="bold")
    head.append(f" ({ctx.reason})", style="dim")
    if ctx.simulated:
        head.append(" [SIMULATED: proposed by the offline simulator]", style="bold yellow")
    head.append("\n")
    head.append("goal: ", style="bold")
    head.append(short(ctx.goal, 300) + "\n")
    budget = budget_text(ctx.budget)
    if budget:
        head.append(f"node budget: {budget}\n", style="magenta")
    if ctx.step is not None and estimate_text(ctx.step):
        head.append(f"planner's estimate for this sub-goal: {estimate_text(ctx.step)}\n")
    hints = tool_hints(ctx)
    risky = destructive_tools(plan, ctx)
    if risky:
        head.append("destructive tools this plan may use: ", style="bold red")
        head.append(id_list(risky) + "\n", style="red")
    parts: list[RenderableType] = [head]
    if ctx.previous is not None:
        if ctx.reason == "replan":
            note = Text("This plan replaces the running plan (a replan)", style="yellow")
        else:
            note = Text("This plan replaces the previous proposal", style="yellow")
        if rejected:
            note.append(f", which was rejected: {short(rejected, 200)}", style="yellow")
        parts += [note, diff_view(ctx.previous, plan, hints)]
    parts.append(plan_review_tree(plan, title=f"plan v{ctx.version}", hints=hints))
    return Group(*parts)
