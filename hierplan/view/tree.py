"""Render a run for people: the plan tree and the cost at every node and level (rich).

Used by ``hierplan view`` and at the end of ``hierplan run``/``demo``. Everything a model or a
user wrote (goals, errors, answers) is printed as text, never as rich markup, and with its
control characters shown as symbols (see :func:`plain`), never sent to the terminal.
"""

from __future__ import annotations

import json
import math
import time
from collections import deque
from collections.abc import Mapping, Sequence
from types import MappingProxyType
from typing import Any

from rich.console import Console, Group, RenderableType
from rich.table import Table
from rich.text import Text
from rich.tree import Tree

from hierplan.plans.plan import Plan
from hierplan.records import DecisionRecord, NodeRecord, PlanVersion, RunResult
from hierplan.redact import redact
from hierplan.text import printable

STATUS_STYLE: Mapping[str, str] = {
    "succeeded": "green",
    "partial": "yellow",
    "failed": "red",
    "cancelled": "bright_black",
    "rejected": "magenta",
    "budget_exhausted": "yellow",
    "pending": "bright_black",
    "running": "cyan",
    "paused": "yellow",
    "skipped": "yellow",
}
DECISION_STYLE: Mapping[str, str] = {
    "approved": "green",
    "edited": "cyan",
    "rejected": "magenta",
    "invalid": "red",
    "pending": "yellow",
}
STATUS_STYLE = MappingProxyType(STATUS_STYLE)  # read-only: shared by every run
DECISION_STYLE = MappingProxyType(DECISION_STYLE)


def money(value: float | None) -> str:
    """USD with enough digits for sub-cent model calls."""
    if value is None:
        return "n/a"
    if 0 < abs(value) < 0.0001:  # a tiny budget or one cheap call: two significant digits,
        decimals = 1 - math.floor(math.log10(abs(value)))  # not $0.0000
        return f"${value:.{decimals}f}"
    # Compared once rounded to what it shows: $0.99996 is $1.00, as $1 is, not $1.0000.
    return f"${value:.4f}" if abs(round(value, 4)) < 1 else f"${value:,.2f}"


_ERROR_LIMIT = 1000  # characters of a run's error shown under the tree


def plain(text: str) -> str:
    r"""``text`` as a report shows it: credentials taken out (:func:`hierplan.redact.redact`)
    and its control characters replaced by visible symbols (:func:`hierplan.text.printable`):
    text from a run (a model's answer, a tool's error, a plan file) could otherwise move the
    cursor, clear the screen or retitle the window of the terminal it is printed to, reorder
    what is shown around it, or stop the printing with a character no encoding can write.

    >>> plain("ok\x1b[2J")
    'ok␛[2J'
    """
    return printable(redact(text))


def short(text: str, limit: int = 70) -> str:
    """One line, cut to ``limit`` characters, control characters shown as symbols."""
    line = plain(" ".join(text.split()))
    return line if len(line) <= limit else line[: limit - 1] + "…"


def budget_text(budget: dict[str, Any]) -> str:
    """A node's budget against its spend: ``spent/limit`` in tokens and USD."""
    limit = budget.get("limit_tokens")
    spent = f"{budget.get('spent_tokens', 0):,}"
    parts = [f"{spent}/{limit:,} tok" if limit is not None else f"{spent} tok"]
    if budget.get("spent_usd") is not None:
        limit_usd = budget.get("limit_usd")
        spent_usd = money(budget["spent_usd"])
        parts.append(f"{spent_usd}/{money(limit_usd)}" if limit_usd is not None else spent_usd)
    text = "budget spent " + ", ".join(parts)
    if budget.get("grant") == "draw":
        text += " (drawn from parent, capped)"
    if budget.get("refused"):
        text += f"; {budget['refused']} call(s) refused"
    if budget.get("overrun_tokens"):
        text += "; OVERRUN"
    return text


def _node_label(node: NodeRecord, budgeted: bool = False) -> Text:
    label = Text()
    label.append(f"{plain(node.path)} ", style="bold")
    label.append(f"{node.kind} ", style="dim")
    label.append(node.status, style=STATUS_STYLE.get(node.status, ""))
    label.append("  ")
    label.append(short(node.goal, 60))
    tokens = node.usage.input_tokens + node.usage.output_tokens
    if node.calls or node.children:
        label.append(
            f"  [{tokens:,} tok, {money(node.cost_usd)}; subtree {money(node.subtree_cost_usd)}]",
            style="dim",
        )
    if node.tool:
        label.append(f"  tool={plain(node.tool)}", style="blue")
    if node.budget:
        label.append(f"  {budget_text(node.budget)}", style="cyan")
    elif budgeted and node.started_at is not None and not node.calls:
        label.append("  tool step: no model calls, no budget", style="dim")
    if len(node.plan_versions) > 1:
        label.append(f"  plan v{len(node.plan_versions)}", style="yellow")
    if node.error and node.status != "succeeded":
        label.append(f"\n{short(node.error, 110)}", style="red")
    _tool_call_lines(label, node)
    return label


# The tool calls a node's line lists; a loop of a hundred calls is summed up by its count.
MAX_TOOL_CALL_LINES = 5


def _tool_call_lines(label: Text, node: NodeRecord) -> None:
    """A line per tool call under the node's: ``tool(arguments) -> result`` or ``-> error``."""
    for call in node.tool_calls[:MAX_TOOL_CALL_LINES]:
        label.append(f"\n  {plain(call.tool)}({short(call.arguments, 50)})", style="blue")
        if call.error is None:
            label.append(f" -> {short(call.result or '', 50)}")
        else:
            label.append(f" -> {short(call.error, 60)}", style="red")
        label.append(f"  {call.duration_s:.2f} s", style="dim")
    hidden = len(node.tool_calls) - MAX_TOOL_CALL_LINES
    if hidden > 0:
        label.append(f"\n  … {hidden} more tool call(s)", style="dim")


TREE_NODES = 400
"""At most this many nodes in the printed run tree (``hierplan run``, ``hierplan view``)."""
TREE_CHILDREN = 40
"""At most this many children of one node in the printed run tree."""


def node_tree(
    root: NodeRecord, *, max_children: int = TREE_CHILDREN, max_nodes: int = TREE_NODES
) -> Tree:
    """The run tree as a rich Tree, cut to ``max_children`` children a node and about
    ``max_nodes`` nodes in all, the levels nearest the root first; where a node's children are
    cut, a line says how many more it has."""
    return _node_tree(root, max_children, max_nodes)[0]


def _node_tree(root: NodeRecord, max_children: int, max_nodes: int) -> tuple[Tree, int]:
    """The tree and how many nodes it shows. Breadth first: a run of 100,000 leaves would
    otherwise print some 64,000 lines, which take longer to draw than the run took."""
    budgeted = root.budget is not None
    tree = Tree(_node_label(root, budgeted))
    queue: deque[tuple[NodeRecord, Tree]] = deque([(root, tree)])
    shown = 1
    while queue:
        node, branch = queue.popleft()
        children = node.children[: max(0, min(max_children, max_nodes - shown))]
        shown += len(children)
        for child in children:
            queue.append((child, branch.add(_node_label(child, budgeted))))
        hidden = len(node.children) - len(children)
        if hidden > 0:
            branch.add(Text(f"… {hidden} more", style="dim"))
    return tree, shown


def levels_table(result: RunResult) -> Table:
    """Tokens and cost per depth, with the run's totals split into planning and execution."""
    table = Table(title="Cost per level", show_footer=True)
    totals = result.totals()
    table.add_column("depth", footer="total")
    table.add_column("nodes", justify="right", footer=str(totals["nodes"]))
    table.add_column("input tokens", justify="right", footer=f"{totals['input_tokens']:,}")
    table.add_column("output tokens", justify="right", footer=f"{totals['output_tokens']:,}")
    table.add_column("cost", justify="right", footer=money(totals["cost_usd"]))
    for row in result.levels():
        table.add_row(
            str(row["depth"]),
            str(row["nodes"]),
            f"{row['input_tokens']:,}",
            f"{row['output_tokens']:,}",
            money(row["cost_usd"]),
        )
    return table


ALLOCATED_NOTE = (
    "allocated: the sum of the level's shares over the run; what a finished node gives back "
    "is allocated again to later siblings"
)


def budget_table(budget: dict[str, Any]) -> Table:
    """Budget against spend per depth (each node's budget covers its subtree)."""
    usd = bool(budget.get("usd_tracked"))
    limit = budget.get("limit") or {}
    spent = budget.get("spent") or {}
    table = Table(
        title=f"Budget per level ({plain(str(budget.get('policy', '')))} allocation)",
        # A share a finished node gives back is allocated again to a sibling that starts later,
        # so a level's allocations can add up to more than the run's limit without any overspend.
        caption=ALLOCATED_NOTE,
        show_footer=True,
    )
    table.add_column("depth", footer="run")
    table.add_column("nodes", justify="right")
    tok_limit = limit.get("tokens")
    table.add_column(
        "allocated tokens", justify="right", footer="" if tok_limit is None else f"{tok_limit:,}"
    )
    table.add_column("spent tokens", justify="right", footer=f"{spent.get('tokens', 0):,}")
    if usd:
        usd_limit = limit.get("usd")
        table.add_column(
            "allocated USD", justify="right", footer="" if usd_limit is None else money(usd_limit)
        )
        table.add_column("spent USD", justify="right", footer=money(spent.get("usd")))
    for row in budget.get("levels", []):
        cells = [
            str(row["depth"]),
            str(row["nodes"]),
            f"{row['allocated_tokens']:,}" if tok_limit is not None else "unlimited",
            f"{row['spent_tokens']:,}",
        ]
        if usd:
            cells.append(
                money(row["allocated_usd"]) if limit.get("usd") is not None else "unlimited"
            )
            cells.append(money(row["spent_usd"]))
        table.add_row(*cells)
    return table


def _budget_summary(text: Text, budget: dict[str, Any]) -> None:
    limit = budget.get("limit") or {}
    spent = budget.get("spent") or {}
    phases = budget.get("phases") or {}
    caps = []
    if limit.get("tokens") is not None:
        caps.append(f"{spent.get('tokens', 0):,} of {limit['tokens']:,} tokens")
    if limit.get("usd") is not None:
        caps.append(f"{money(spent.get('usd'))} of {money(limit['usd'])}")
    text.append("\nbudget: ", style="bold")
    text.append("spent " + " and ".join(caps))
    split = []
    for phase in ("planning", "execution"):
        figures = phases.get(phase) or {}
        amount = f"{figures.get('tokens', 0):,} tok"
        if figures.get("usd") is not None:
            amount += f" {money(figures['usd'])}"
        split.append(f"{phase} {amount}")
    text.append(f" ({', '.join(split)})")
    if budget.get("exhausted"):
        text.append(f"; {len(budget['exhausted'])} node(s) ran out of budget", style="yellow")
    overrun = budget.get("overrun") or {}
    if overrun.get("tokens"):
        text.append(f"; usage above reservations: {overrun['tokens']:,} tokens", style="red")


def summary_lines(result: RunResult) -> Text:
    """Status, answer, model, and planning vs execution cost."""
    totals = result.totals()
    text = Text()
    text.append("status: ", style="bold")
    text.append(result.status, style=STATUS_STYLE.get(result.status, ""))
    if result.status == "succeeded" and not (result.verification or {"ok": True}).get("ok"):
        # The run did what it planned, but the result is wrong: hierplan run exits 1.
        text.append(" · verification failed (exit 1)", style="red")
    if not result.answer_complete:
        text.append(" (answer incomplete)", style="yellow")
    model = plain(result.model) + (" [SIMULATED]" if result.simulated else "")
    priced = result.stats.get("priced_as")
    if result.simulated and priced:
        model += f", priced as {plain(', '.join(priced))}"
    text.append(f"\nstrategy: {plain(result.strategy)}   model: {model}")
    text.append(
        f"\ncalls: {totals['calls']}   cost: {money(totals['cost_usd'])} "
        f"(planning {money(totals['planning_cost_usd'])}, "
        f"execution {money(totals['execution_cost_usd'])})"
    )
    if totals["unpriced_calls"]:
        text.append(f"   {totals['unpriced_calls']} call(s) without a known price", style="yellow")
    if result.budget:
        _budget_summary(text, result.budget)
    if result.error:
        # The error's end often says what to do (a larger budget, a key to set), so it is cut
        # only when it runs to several lines' worth, as a provider's message may.
        text.append(f"\nerror: {short(result.error, _ERROR_LIMIT)}", style="red")
    if result.status != "succeeded":
        _not_done(text, result)
    if result.verification is not None:
        ok = bool(result.verification.get("ok"))
        text.append("\nverified: ", style="bold")
        summary = plain(str(result.verification.get("summary", "")))
        text.append(summary, style="green" if ok else "red")
    text.append("\nanswer:", style="bold")
    text.append(answer_text(result.answer))
    return text


def answer_text(answer: str, lines: int = 12, limit: int = 400) -> str:
    """An answer as shown after ``answer:``: on the same line when it is one line; else its
    lines (each cut to ``limit`` characters), the first ``lines`` of them, each on its own."""
    rows = [" ".join(row.split()) for row in answer.splitlines() if row.strip()]
    if len(rows) <= 1:
        return " " + (short(answer, limit) or "(none)")
    shown = [f"\n  {short(row, limit)}" for row in rows[:lines]]
    if len(rows) > lines:
        shown.append(f"\n  … {len(rows) - lines} more line(s) in the run record")
    return "".join(shown)


def audit_table(result: RunResult) -> Table | None:
    """Every plan version and each decision on it: what, who or what decided, when, and why.

    Validators' findings and reviewers' notes are shown with the decision they led to; a
    version that replaced another shows the diff. ``None`` when no node planned.
    """
    table = Table(title="Plan reviews (audit trail)", show_lines=False)
    for name in ("node", "v", "reason", "decision", "by", "at"):
        table.add_column(name, no_wrap=name != "by")
    table.add_column("details", overflow="fold", ratio=1)
    for node in result.nodes():
        for version in node.plan_versions:
            history = version.history or []
            diff = version.diff.summary() if version.diff is not None else ""
            if not history and version.decision is not None:
                history = [_legacy_decision(version)]
            for i, entry in enumerate(history or [None]):
                first = i == 0
                decision = "" if entry is None else entry.decision
                details = (
                    "" if entry is None else "; ".join(filter(None, [entry.note, *entry.problems]))
                )
                if first and diff:
                    details = f"diff {diff}" + (f"; {details}" if details else "")
                table.add_row(
                    plain(node.path) if first else "",
                    str(version.version) if first else "",
                    plain(version.reason) if first else "",
                    Text(plain(decision), style=DECISION_STYLE.get(decision, "")),
                    Text("" if entry is None else plain(entry.by)),
                    "" if entry is None else _clock(entry.at),
                    Text(short(details, 160)),
                )
    return table if table.row_count else None


def _legacy_decision(version: PlanVersion) -> DecisionRecord:
    return DecisionRecord(
        version.decision or "",
        version.decided_by or "",
        version.decided_at or version.created_at,
        version.note,
        list(version.problems),
    )


def _clock(at: float) -> str:
    return time.strftime("%m-%d %H:%M:%S", time.localtime(at))


def _not_done(text: Text, result: RunResult, limit: int = 12) -> None:
    undone = result.not_done()
    if not undone:
        return
    text.append("\nnot done:", style="bold yellow")
    for item in undone[:limit]:
        text.append(f"\n  {plain(item['path'])} {item['status']}: {short(item['goal'], 70)}")
        if item["reason"] != item["status"]:
            text.append(f" ({short(item['reason'], 90)})", style="dim")
    if len(undone) > limit:
        text.append(f"\n  … {len(undone) - limit} more", style="dim")


def render_run(result: RunResult) -> RenderableType:
    """Everything ``hierplan view`` shows."""
    title = Text(f"run {plain(result.run_id)}: {short(result.goal, 90)}", style="bold")
    tree, shown = _node_tree(result.tree, TREE_CHILDREN, TREE_NODES)
    parts: list[RenderableType] = [title, tree]
    nodes = sum(1 for _ in result.tree.walk())
    if shown < nodes:
        parts.append(
            Text(
                f"{shown:,} of {nodes:,} nodes shown; hierplan view RUN.json --html FILE "
                "writes a report with every node",
                style="dim",
            )
        )
    parts.append(levels_table(result))
    audit = audit_table(result)
    if audit is not None:
        parts.append(audit)
    if result.budget:
        parts.append(budget_table(result.budget))
    return Group(*parts, summary_lines(result))


def data_text(value: Any, limit: int = 60) -> str:
    """JSON-like data (a step's arguments) as JSON on one line, cut to ``limit`` characters;
    data nested too deep to write is said to be."""
    try:
        return short(json.dumps(value, default=str), limit)
    except RecursionError:
        return "(nested too deeply to show)"


PLAN_TREE_STEPS = 200
"""At most this many steps in a printed plan (``hierplan validate``, a run's root plan)."""
LISTED_IDS = 10
"""At most this many step ids in one list of a printed step (its dependencies, its tools)."""


def id_list(ids: Sequence[str], limit: int = LISTED_IDS) -> str:
    """Names from a plan (step ids, tool names) joined by ``, `` as a report shows them: each
    cut short and printable, at most ``limit`` of them and how many more. A plan file's
    ``depends_on`` holds any strings, as many as it likes."""
    shown = ", ".join(short(name, 66) for name in ids[:limit])
    more = len(ids) - limit
    return f"{shown} and {more:,} more" if more > 0 else shown


def plan_tree(plan: Plan, *, title: str = "plan", max_steps: int = PLAN_TREE_STEPS) -> Tree:
    """A plan as a tree of steps with their dependencies and tools, its first ``max_steps``
    steps and how many more there are (a plan of 10,000 steps takes seconds to draw and
    thousands of lines to show; the file has them all)."""
    tree = Tree(Text(f"{title}: {short(plan.goal, 90)}", style="bold"))
    for step in plan.steps[:max_steps]:
        label = Text()
        label.append(f"{plain(step.id)} ", style="bold")
        label.append(f"[{step.kind}] ", style="dim")
        label.append(short(step.title, 60))
        if step.tool:
            label.append(f"  tool={short(step.tool, 66)}", style="blue")
            if step.args:
                label.append(f" {data_text(step.args, 50)}", style="blue")
        if step.depends_on:
            label.append(f"  after {id_list(step.depends_on)}", style="dim")
        tree.add(label)
    hidden = len(plan.steps) - max_steps
    if hidden > 0:
        tree.add(Text(f"… {hidden:,} more steps", style="dim"))
    return tree


def print_run(result: RunResult, console: Console | None = None) -> None:
    """Print :func:`render_run` to the console."""
    (console or Console()).print(render_run(result))
