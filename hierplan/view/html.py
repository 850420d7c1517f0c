"""A self-contained HTML report of a run: ``hierplan view DIR/run.json --html report.html``.

One file, no external resources (styles and the small script are inline). It shows the run's
summary, the cost per level, the collapsible plan tree with tokens, cost (own and subtree) and
budget at every node, each planner's plan versions with the gate's decisions and the diff against
the previous version, and a timeline of the nodes, which shows what ran concurrently.

Everything taken from the run (goals, plans, errors, answers: text a model or a user wrote) is
HTML-escaped. A Content-Security-Policy allows only the report's own script (by its hash), so even
markup that slipped through could not run.
"""

from __future__ import annotations

import base64
import hashlib
from collections.abc import Iterator
from html import escape
from pathlib import Path

from hierplan.files import make_directory, write_atomic
from hierplan.plans.plan import Plan, Step
from hierplan.records import NodeRecord, PlanVersion, RunResult, subtree_costs
from hierplan.redact import redact
from hierplan.text import printable_lines
from hierplan.units import PICO_PER_USD
from hierplan.view.critical_path import (
    call_end,
    producing_call,
    run_critical_path,
    started_while_planning,
)
from hierplan.view.tree import ALLOCATED_NOTE, money, short

TIMELINE_LIMIT = 2000
"""Nodes shown on the timeline at most (the earliest to start)."""

CALLS_PER_ROW_LIMIT = 200
"""Model calls drawn on one node's row of the timeline at most (the first made)."""

OPEN_DEPTH = 2
"""Nodes down to this depth start expanded."""

_CSS = """
body{font:14px/1.45 system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:24px;color:#1d2330}
h1{font-size:20px;margin:0 0 4px}h2{font-size:16px;margin:28px 0 8px}
.muted{color:#6b7280}.mono{font-family:ui-monospace,SFMono-Regular,Menlo,monospace;font-size:12px}
table{border-collapse:collapse;margin:6px 0}td,th{border:1px solid #e5e7eb;padding:3px 8px;
text-align:left}th{background:#f3f4f6}td.num,th.num{text-align:right}
.badge{display:inline-block;border-radius:4px;padding:0 6px;font-size:12px;color:#fff;
background:#6b7280}.s-succeeded{background:#15803d}.s-failed{background:#b91c1c}
.s-partial,.s-budget_exhausted,.s-paused,.s-skipped{background:#b45309}.s-rejected{background:#7e22ce}
.s-cancelled,.s-pending{background:#9ca3af}.s-running{background:#0369a1}
.sim{background:#ca8a04}details.node{margin-left:18px;border-left:1px dotted #d1d5db;
padding-left:6px}details.node>summary{cursor:pointer;padding:2px 0}
.goal{font-weight:500}.figs{color:#374151;font-size:12px;margin-left:6px}
.body{margin:4px 0 8px 18px}.err{color:#b91c1c}pre{white-space:pre-wrap;margin:2px 0;
background:#f9fafb;padding:6px;border:1px solid #eef0f3}
.d-added{background:#dcfce7}.d-removed{background:#fee2e2;text-decoration:line-through}
.d-changed{background:#fef9c3}.toolbar button{margin-right:6px}
.tl{position:relative;height:18px;background:#f3f4f6;min-width:400px}
.bar{position:absolute;top:4px;height:10px;border-radius:2px;background:#60a5fa}
.bar.k-planner{background:#ddd6fe}.bar.st-failed{background:#f87171}
.bar.call.planning{top:1px;height:16px;background:#6d28d9}
.bar.call.mark{top:7px;height:4px;background:#1e3a8a;border-radius:0}
.bar.crit{outline:2px solid #111827;outline-offset:1px}
.bar.streamed{background-image:repeating-linear-gradient(135deg,transparent 0 3px,
rgba(255,255,255,.7) 3px 6px)}
.legend .key{white-space:nowrap}.legend .bar{position:relative;display:inline-block;top:2px;
width:18px;margin:0 2px}.legend .bar.node{background:#60a5fa}
.tl-row td{padding:1px 6px}.tl-row td.lab{white-space:nowrap}#timeline{width:100%}
#timeline td:last-child{width:60%}
"""

_SCRIPT = """
document.addEventListener('DOMContentLoaded', function () {
  function setAll(open) {
    document.querySelectorAll('details.node').forEach(function (d) { d.open = open; });
  }
  document.getElementById('expand-all').addEventListener('click', function () { setAll(true); });
  document.getElementById('collapse-all').addEventListener('click', function () { setAll(false); });
});
"""


def e(value: object) -> str:
    """HTML-escape ``value`` (quotes too, so it is safe in attributes), with credentials taken
    out (:func:`hierplan.redact.redact`) and control, bidirectional and surrogate characters
    shown as visible symbols: a NUL makes text tools take the file for binary, the others
    reorder the text shown around them or cannot be written as UTF-8. Tabs and line breaks
    stay: multi-line answers are shown as written."""
    return escape(printable_lines(redact(str(value))), quote=True)


def _tokens(node: NodeRecord) -> int:
    return node.usage.input_tokens + node.usage.output_tokens


def _summary(result: RunResult) -> str:
    totals = result.totals()
    model = e(result.model)
    if result.simulated:
        model += ' <span class="badge sim">SIMULATED</span>'
    rows = [
        ("status", f'<span class="badge s-{e(result.status)}">{e(result.status)}</span>'),
        ("strategy", e(result.strategy)),
        ("model", model),
        (
            "cost",
            f'<span id="total-cost" data-cost="{totals["cost_usd"]!r}">'
            f"{e(money(totals['cost_usd']))}</span> (planning "
            f"{e(money(totals['planning_cost_usd']))}, execution "
            f"{e(money(totals['execution_cost_usd']))})",
        ),
        (
            "tokens",
            f"{totals['input_tokens']:,} in, {totals['output_tokens']:,} out, "
            f"{totals['calls']} calls, {totals['nodes']} nodes",
        ),
    ]
    if totals["unpriced_calls"]:
        rows.append(("unpriced calls", str(totals["unpriced_calls"])))
    if result.finished_at and result.started_at:
        rows.append(("wall time", f"{result.finished_at - result.started_at:.2f} s"))
    if result.stats.get("peak_concurrent_leaves"):
        rows.append(("peak leaves at once", e(result.stats["peak_concurrent_leaves"])))
    if result.verification is not None:
        rows.append(("verified", e(result.verification.get("summary", ""))))
    if result.error:
        rows.append(("error", f'<span class="err">{e(result.error)}</span>'))
    rows.append(("answer", f"<pre>{e(result.answer) or '(none)'}</pre>"))
    body = "".join(f"<tr><th>{e(k)}</th><td>{v}</td></tr>" for k, v in rows)
    return f'<table id="summary">{body}</table>'


def _figure(value: object) -> str:
    """A budget figure as people read it: whole numbers in full with thousands separators
    (``:g`` would show 50,000,000 tokens as ``5e+07``), fractions to twelve significant digits."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return str(value)
    if isinstance(value, int):
        return f"{value:,}"
    return f"{value:,.12g}"


def _level_budgets(result: RunResult) -> dict[int, str]:
    """The run budget's figures per depth, as the terminal's budget table shows them: what
    the level's nodes were allocated and spent (empty when the run had no budget). Not a sum
    of the nodes' own figures: a share a node hands down to its children counts at both
    depths, so such sums pass the run's limit."""
    budget = result.budget or {}
    limit = budget.get("limit") or {}
    usd = bool(budget.get("usd_tracked"))
    out: dict[int, str] = {}
    for row in budget.get("levels", []):
        tokens = "unlimited" if limit.get("tokens") is None else _figure(row["allocated_tokens"])
        parts = [f"allocated {tokens} tok, spent {_figure(row['spent_tokens'])} tok"]
        if usd:
            dollars = "unlimited" if limit.get("usd") is None else money(row["allocated_usd"])
            parts.append(f"allocated {dollars}, spent {money(row['spent_usd'])}")
        out[int(row["depth"])] = "; ".join(parts)
    return out


def _levels(result: RunResult) -> str:
    budgets = _level_budgets(result)
    rows = []
    for row in result.levels():
        budget = ""
        if budgets:
            budget = f'<td class="budget">{e(budgets.get(row["depth"], ""))}</td>'
        rows.append(
            f'<tr data-depth="{row["depth"]}"><td>{row["depth"]}</td>'
            f'<td class="num">{row["nodes"]}</td>'
            f'<td class="num">{row["input_tokens"]:,}</td>'
            f'<td class="num">{row["output_tokens"]:,}</td>'
            f'<td class="num level-cost" data-cost="{row["cost_usd"]!r}">'
            f"{e(money(row['cost_usd']))}</td>{budget}</tr>"
        )
    totals = result.totals()
    rows.append(
        f'<tr class="total"><th>total</th><th class="num">{totals["nodes"]}</th>'
        f'<th class="num">{totals["input_tokens"]:,}</th>'
        f'<th class="num">{totals["output_tokens"]:,}</th>'
        f'<th class="num" data-cost="{totals["cost_usd"]!r}">{e(money(totals["cost_usd"]))}'
        f"</th>{'<th></th>' if budgets else ''}</tr>"
    )
    head = (
        '<tr><th>depth</th><th class="num">nodes</th><th class="num">input tokens</th>'
        '<th class="num">output tokens</th><th class="num">cost</th>'
        f"{'<th>budget</th>' if budgets else ''}</tr>"
    )
    note = f'<p class="muted">{e(ALLOCATED_NOTE)}</p>' if budgets else ""
    return f'<table id="levels">{head}{"".join(rows)}</table>{note}'


def _node_summary(node: NodeRecord, subtree: float) -> str:
    parts = [
        f'<span class="mono">{e(node.path)}</span> <span class="muted">{e(node.kind)}</span> ',
        f'<span class="badge s-{e(node.status)}">{e(node.status)}</span> ',
        f'<span class="goal">{e(short(node.goal, 90))}</span>',
        '<span class="figs">',
        f'<span class="tokens">{_tokens(node):,} tok</span> · ',
        f'<span class="cost" data-cost="{node.cost_usd!r}">{e(money(node.cost_usd))}</span>',
        f' · subtree <span class="subtree-cost" data-cost="{subtree!r}">{e(money(subtree))}</span>',
    ]
    if node.budget:
        budget = ", ".join(f"{k}={_figure(v)}" for k, v in node.budget.items())
        parts.append(f' · budget <span class="budget">{e(budget)}</span>')
    if node.tool:
        parts.append(f' · tool <span class="mono">{e(node.tool)}</span>')
    if len(node.plan_versions) > 1:
        parts.append(f" · plan v{len(node.plan_versions)}")
    parts.append("</span>")
    return "".join(parts)


def _calls_table(node: NodeRecord) -> str:
    if not node.calls:
        return ""
    head = (
        "<tr><th>#</th><th>phase</th><th>purpose</th><th>model</th>"
        '<th class="num">in</th><th class="num">out</th><th class="num">cost</th>'
        '<th class="num">seconds</th><th>flags</th></tr>'
    )
    rows = "".join(
        f"<tr><td>{i}</td><td>{e(c.phase)}</td><td>{e(c.purpose)}</td><td>{e(c.model)}</td>"
        f'<td class="num">{c.usage.input_tokens:,}</td>'
        f'<td class="num">{c.usage.output_tokens:,}</td>'
        f'<td class="num">{e(money(c.cost_usd))}</td><td class="num">{c.duration_s:.3f}</td>'
        f"<td>{e(', '.join(c.flags))}</td></tr>"
        for i, c in enumerate(node.calls, 1)
    )
    return f'<table class="calls">{head}{rows}</table>'


def _tool_calls_table(node: NodeRecord) -> str:
    if not node.tool_calls:
        return ""
    head = (
        "<tr><th>#</th><th>tool</th><th>arguments</th><th>result or error</th>"
        '<th class="num">seconds</th></tr>'
    )
    rows = "".join(
        f'<tr><td>{i}</td><td class="mono">{e(c.tool)}</td><td class="mono">{e(c.arguments)}</td>'
        + (
            f'<td class="mono">{e(c.result or "")}</td>'
            if c.error is None
            else f'<td class="err">{e(c.error)}</td>'
        )
        + f'<td class="num">{c.duration_s:.3f}</td></tr>'
        for i, c in enumerate(node.tool_calls, 1)
    )
    return f'<table class="tool-calls">{head}{rows}</table>'


def _plan_table(plan: Plan, previous: Plan | None) -> str:
    before = previous.step_map() if previous is not None else {}
    after = plan.step_map()
    rows = []
    for step in plan.steps:
        mark = ""
        if previous is not None:
            if step.id not in before:
                mark = "d-added"
            elif before[step.id] != step:
                mark = "d-changed"
        rows.append(_step_row(step, mark))
    for sid, old in before.items():
        if sid not in after:
            rows.append(_step_row(old, "d-removed"))
    head = (
        "<tr><th>id</th><th>kind</th><th>title</th><th>tool</th><th>after</th>"
        "<th>instruction</th></tr>"
    )
    return f'<table class="plan">{head}{"".join(rows)}</table>'


def _step_row(step: Step, mark: str) -> str:
    return (
        f'<tr class="{mark}" data-step="{e(step.id)}"><td class="mono">{e(step.id)}</td>'
        f"<td>{e(step.kind)}</td><td>{e(step.title)}</td>"
        f'<td class="mono">{e(step.tool or "")}</td><td>{e(", ".join(step.depends_on))}</td>'
        f"<td>{e(short(step.instruction, 160))}</td></tr>"
    )


def _plan_versions(node: NodeRecord) -> str:
    if not node.plan_versions:
        return ""
    out = ['<div class="plans">']
    previous: Plan | None = None
    for version in node.plan_versions:
        out.append(_plan_version(version, previous))
        previous = version.plan
    out.append("</div>")
    return "".join(out)


def _plan_version(version: PlanVersion, previous: Plan | None) -> str:
    decision = e(version.decision or "undecided")
    head = (
        f"plan v{version.version} <span class='muted'>({e(version.reason)})</span> "
        f'<span class="badge decision">{decision}</span>'
    )
    if version.decided_by:
        head += f" <span class='muted'>by {e(version.decided_by)}</span>"
    if version.diff is not None:
        head += f' <span class="diff mono">{e(version.diff.summary())}</span>'
    body = [_plan_table(version.plan, previous if version.diff is not None else None)]
    if version.note:
        body.append(f"<div>note: {e(version.note)}</div>")
    for problem in version.problems:
        body.append(f'<div class="err">problem: {e(problem)}</div>')
    return (
        f'<details class="plan-version" data-version="{version.version}">'
        f"<summary>{head}</summary>{''.join(body)}</details>"
    )


def _node_body(node: NodeRecord) -> str:
    facts = [f"<div><b>goal</b>: {e(node.goal)}</div>"]
    if node.step_id:
        facts.append(f'<div><b>step</b>: <span class="mono">{e(node.step_id)}</span></div>')
    if node.attempts > 1:
        facts.append(f"<div><b>attempts</b>: {node.attempts}</div>")
    if node.transient_retries:
        facts.append(
            "<div><b>retried after a pause</b>: "
            f"{node.transient_retries} call(s) whose retries ran out on transient errors</div>"
        )
    if node.duration_s is not None:
        facts.append(f"<div><b>time</b>: {node.duration_s:.3f} s</div>")
    if node.error:
        facts.append(f'<div class="err"><b>error</b>: {e(node.error)}</div>')
    if node.output:
        facts.append(f"<details><summary>output</summary><pre>{e(node.output)}</pre></details>")
    return (
        f'<div class="body">{"".join(facts)}{_calls_table(node)}{_tool_calls_table(node)}'
        f"{_plan_versions(node)}</div>"
    )


def _tree(root: NodeRecord) -> str:
    costs = subtree_costs(root)
    parts: list[str] = []

    def emit(node: NodeRecord) -> None:
        is_open = " open" if node.depth <= OPEN_DEPTH else ""
        parts.append(
            f'<details class="node" data-path="{e(node.path)}" data-depth="{node.depth}"'
            f' data-status="{e(node.status)}"{is_open}>'
            f"<summary>{_node_summary(node, costs[node.path] / PICO_PER_USD)}</summary>"
            f"{_node_body(node)}"
        )
        if node.children:
            parts.append('<div class="children">')
            for child in node.children:
                emit(child)
            parts.append("</div>")
        parts.append("</details>")

    emit(root)
    return f'<div id="tree">{"".join(parts)}</div>'


def _timed(root: NodeRecord) -> Iterator[NodeRecord]:
    for node in root.walk():
        if node.started_at is not None and node.finished_at is not None:
            yield node


class _Axis:
    """The timeline's one time axis: a time as a percentage of the run's span."""

    def __init__(self, nodes: list[NodeRecord]) -> None:
        starts = [n.started_at or 0.0 for n in nodes]
        ends = [n.finished_at or 0.0 for n in nodes]
        for node in nodes:
            starts += [c.started_at for c in node.calls[:CALLS_PER_ROW_LIMIT]]
            ends += [call_end(c) for c in node.calls[:CALLS_PER_ROW_LIMIT]]
        self.start = min(starts)
        self.span = max(max(ends) - self.start, 1e-9)

    def place(self, begin: float, end: float) -> str:
        """The style that puts a bar from ``begin`` to ``end`` (at least 0.2% wide: a call of
        a millisecond in a run of minutes still shows)."""
        left = (begin - self.start) / self.span * 100
        width = max((end - begin) / self.span * 100, 0.2)
        return f"left:{left:.3f}%;width:{width:.3f}%"


def _bar(classes: str, style: str, label: str, data: str = "") -> str:
    # The label is the bar's title (shown on hover) and its accessible name, so what the
    # colours and outlines say is also said in words.
    return (
        f'<div class="{classes}"{data} style="{style}" role="img" title="{e(label)}" '
        f'aria-label="{e(label)}"></div>'
    )


def _node_bar(node: NodeRecord, axis: _Axis, critical: bool, streamed: str | None) -> str:
    started, finished = node.started_at or 0.0, node.finished_at or 0.0
    classes = f"bar node k-{e(node.kind)} st-{e(node.status)}"
    label = f"{node.path} ({node.kind}, {node.status}): {finished - started:.3f} s"
    if critical:
        classes += " crit"
        label += "; on the critical path"
    if streamed is not None:
        classes += " streamed"
        label += f"; started while its plan was being written ({streamed})"
    return _bar(classes, axis.place(started, finished), label)


def _call_bars(node: NodeRecord, axis: _Axis, critical: set[int]) -> str:
    bars = []
    for index, call in enumerate(node.calls[:CALLS_PER_ROW_LIMIT]):
        planning = call.phase == "planning"
        classes = "bar call planning" if planning else "bar call mark"
        label = f"{node.path}: {call.phase} call {call.purpose!r}, {call.duration_s:.3f} s"
        if index in critical:
            classes += " crit"
            label += "; on the critical path"
        place = axis.place(call.started_at, call_end(call))
        bars.append(_bar(classes, place, label, f' data-call="{index}"'))
    return "".join(bars)


def _streamed(parent: NodeRecord | None, node: NodeRecord) -> str | None:
    """Why ``node`` counts as streamed (its plan's call, and how much later it ended), or
    ``None`` when it started after its plan was written."""
    if parent is None or not started_while_planning(parent, node):
        return None
    index = producing_call(parent, node)
    assert index is not None  # started_while_planning found it
    call = parent.calls[index]
    ahead = call_end(call) - (node.started_at or 0.0)
    return f"the planning call of {parent.path} ended {ahead:.3f} s later"


def _timeline(result: RunResult) -> str:
    nodes = sorted(_timed(result.tree), key=lambda n: (n.started_at or 0.0, n.path))
    if not nodes:
        return '<p class="muted">No node has timings.</p>'
    shown = nodes[:TIMELINE_LIMIT]
    axis = _Axis(shown)
    path = run_critical_path(result.tree)
    critical_nodes = {link.path for link in path if link.call is None}
    critical_calls: dict[str, set[int]] = {}
    for link in path:
        if link.call is not None:
            critical_calls.setdefault(link.path, set()).add(link.call)
    parents = {id(child): node for node in result.tree.walk() for child in node.children}
    rows = []
    for node in shown:
        streamed = _streamed(parents.get(id(node)), node)
        bars = _node_bar(node, axis, node.path in critical_nodes, streamed) + _call_bars(
            node, axis, critical_calls.get(node.path, set())
        )
        rows.append(
            f'<tr class="tl-row" data-path="{e(node.path)}"><td class="lab mono">'
            f'{e(node.path)}</td><td class="lab muted">{e(short(node.goal, 50))}</td>'
            f'<td><div class="tl">{bars}</div></td></tr>'
        )
    more = ""
    if len(nodes) > TIMELINE_LIMIT:
        more = f'<p class="muted">{len(nodes) - TIMELINE_LIMIT} more nodes not shown.</p>'
    return (
        f'<p class="muted">0 to {axis.span:.3f} s; bars that overlap ran at the same time.</p>'
        f"{_LEGEND}"
        f'<table id="timeline">{"".join(rows)}</table>{more}'
    )


_LEGEND = (
    '<p class="muted legend">One row a node: its bar runs from its start to its end. '
    '<span class="key"><span class="bar call planning"></span> a planning call</span> '
    '<span class="key"><span class="bar call mark"></span> an executor\'s model call</span> '
    '<span class="key"><span class="bar node crit"></span> outlined: on the critical path, '
    "the chain of steps and planning calls that ended last</span> "
    '<span class="key"><span class="bar node streamed"></span> striped: a step that started '
    "while its plan was being written</span>. Hover a bar for its figures.</p>"
)


def render_html(result: RunResult) -> str:
    """The whole report as one HTML document."""
    script_hash = base64.b64encode(hashlib.sha256(_SCRIPT.encode()).digest()).decode()
    csp = (
        "default-src 'none'; style-src 'unsafe-inline'; "
        f"script-src 'sha256-{script_hash}'; base-uri 'none'; form-action 'none'"
    )
    # The title is what a tab, a bookmark or a printout shows: a simulated run says so there.
    title = f"hierplan run {result.run_id}" + (" (SIMULATED)" if result.simulated else "")
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        f'<meta http-equiv="Content-Security-Policy" content="{e(csp)}">'
        f"<title>{e(title)}</title><style>{_CSS}</style>"
        f"<script>{_SCRIPT}</script></head><body>"
        f'<h1>{e(title)}</h1><p class="goal" id="run-goal">{e(result.goal)}</p>'
        f"{_summary(result)}<h2>Cost per level</h2>{_levels(result)}"
        '<h2>Plan tree</h2><div class="toolbar"><button id="expand-all" type="button">'
        'expand all</button><button id="collapse-all" type="button">collapse all</button></div>'
        f"{_tree(result.tree)}<h2>Timeline</h2>{_timeline(result)}"
        f'<p class="muted">price table {e(result.price_table)}</p></body></html>\n'
    )


def write_html(result: RunResult, path: Path) -> Path:
    """Write the report to ``path`` atomically (rendered first: a record that cannot be shown
    leaves no directory behind)."""
    page = render_html(result)
    make_directory(path.parent, "the report's directory")
    write_atomic(path, page)
    return path
