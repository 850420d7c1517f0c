"""The run reports without a browser: the HTML report's structure, figures and escaping (with
fuzzing), the terminal report's text, and ``hierplan view``."""

from __future__ import annotations

import html
import io
import json
import re
import subprocess
import sys
import time
import typing
from html.parser import HTMLParser
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st
from rich.console import Console
from typer.testing import CliRunner

import hierplan
from hierplan.cli import app
from hierplan.plans.plan import Plan, Step, diff_plans
from hierplan.records import CallRecord, NodeRecord, NodeStatus, PlanVersion, RunResult
from hierplan.units import Usage
from hierplan.view.html import render_html
from hierplan.view.tree import ALLOCATED_NOTE, money, render_run

HIERPLAN = [sys.executable, "-c", "from hierplan.cli import main; main()"]
HOSTILE = '<script>window.__pwned = 1</script><img src=x onerror="window.__pwned = 2">'
# Tags the report itself writes; anything else would have come from the run's content.
OWN_TAGS = {
    "html", "head", "meta", "title", "style", "script", "body", "h1", "h2", "p", "table",
    "tr", "th", "td", "span", "pre", "div", "details", "summary", "b", "button",
}  # fmt: skip


class Tags(HTMLParser):
    """Collects start tags and their attribute names."""

    def __init__(self) -> None:
        super().__init__()
        self.tags: list[str] = []
        self.attributes: set[str] = set()
        self.text: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append(tag)
        self.attributes.update(name for name, _ in attrs)

    def handle_data(self, data: str) -> None:
        self.text.append(data)


def sample_run(text: str = "Migrate the shop", *, budget: bool = True) -> RunResult:
    """A small three-level run record with two plan versions and a failure."""
    now = time.time()
    v1 = Plan(
        goal=text,
        steps=[
            Step(id="a", title=text[:200] or "a", instruction=text or "a", kind="subgoal"),
            Step(id="b", title="Copy", instruction="copy", tool="copy_rows", depends_on=["a"]),
        ],
    )
    v2 = Plan(
        goal=text,
        steps=[
            Step(id="a", title=text[:200] or "a", instruction=text or "a", kind="subgoal"),
            Step(id="c", title="Copy again", instruction="copy", tool="copy_rows"),
        ],
    )
    leaf = NodeRecord(
        path="1.1.1", kind="executor", goal=text, depth=3, status="failed", error=text,
        started_at=now + 0.1, finished_at=now + 0.4, output=text, tool="copy_rows",
    )  # fmt: skip
    leaf.add_call(
        CallRecord("execution", "sim", "execute", Usage(100, 10), 120_000_000, now + 0.1, 0.2)
    )
    middle = NodeRecord(
        path="1.1", kind="planner", goal=text, depth=2, status="partial", children=[leaf],
        started_at=now + 0.05, finished_at=now + 0.5, step_id="a",
    )  # fmt: skip
    middle.add_call(CallRecord("planning", "sim", "plan", Usage(500, 80), 900_000_000, now, 0.1))
    root = NodeRecord(
        path="1", kind="planner", goal=text, depth=1, status="succeeded", children=[middle],
        started_at=now, finished_at=now + 1.0,
        budget={"usd": 0.5, "spent_usd": 0.2, "note": text} if budget else None,
        plan_versions=[
            PlanVersion(1, v1, "initial", now, "approved", "auto", note=text),
            PlanVersion(2, v2, "replan", now, "rejected", "reviewer", note=text,
                        problems=[text], diff=diff_plans(v1, v2)),
        ],
    )  # fmt: skip
    root.add_call(CallRecord("planning", "sim", "plan", Usage(1000, 200), 2_100_000_000, now, 0.1))
    return RunResult(
        run_id="r1", goal=text, strategy="hierarchical", model="sim", simulated=True,
        status="partial", answer=text, tree=root, started_at=now, finished_at=now + 1.0,
        error=text, verification={"ok": False, "summary": text}, price_table="2025-11-01",
    )  # fmt: skip


def test_report_has_every_node_level_and_cost() -> None:
    result = sample_run()
    page = render_html(result)
    record = result.to_dict()
    for node in result.nodes():
        assert f'data-path="{node.path}"' in page
    # subtree costs as run.json has them, shown and machine-readable
    stack = [record["tree"]]
    while stack:
        node = stack.pop()
        stack.extend(node["children"])
        assert f'data-cost="{node["subtree_cost_usd"]!r}">{money(node["subtree_cost_usd"])}' in page
    for level in record["levels"]:
        assert f'data-cost="{level["cost_usd"]!r}">{money(level["cost_usd"])}' in page
    assert 'id="total-cost" data-cost="' + repr(record["totals"]["cost_usd"]) in page
    assert "+1 -1 ~0 (added: c; removed: b)" in page
    assert 'class="d-added" data-step="c"' in page and 'class="d-removed" data-step="b"' in page
    assert 'budget <span class="budget">usd=0.5, spent_usd=0.2' in page
    # no run budget (only a node's): no per-level budget column, which shows the run's
    assert '<td class="budget">' not in page
    assert page.count('class="tl-row"') == 3
    assert "SIMULATED" in page


def test_a_simulated_run_says_so_in_the_report_title() -> None:
    result = sample_run()
    page = render_html(result)
    assert "<title>hierplan run r1 (SIMULATED)</title>" in page
    assert "<h1>hierplan run r1 (SIMULATED)</h1>" in page
    result.simulated = False
    real = render_html(result)
    assert "<title>hierplan run r1</title>" in real and "SIMULATED" not in real


def test_report_is_self_contained() -> None:
    page = render_html(sample_run())
    for needle in ("http://", "https://", "src=", "href=", "@import", "url("):
        assert needle not in page


def _check_inert(page: str, text: str) -> None:
    parser = Tags()
    parser.feed(page)
    assert set(parser.tags) <= OWN_TAGS
    assert parser.tags.count("script") == 1
    assert not any(a.startswith("on") for a in parser.attributes)
    # the content is there, as text (control characters shown as symbols: compared without
    # either)
    wanted = _unshown(text).strip()[:20]
    assert wanted == "" or any(wanted in _unshown(t) for t in parser.text)


def _unshown(text: str) -> str:
    return re.sub(
        "[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069\u2400-\u2421\ufffd]",
        "",
        text,
    )


def test_hostile_content_is_escaped() -> None:
    page = render_html(sample_run(HOSTILE))
    assert HOSTILE not in page
    assert "&lt;script&gt;window.__pwned = 1&lt;/script&gt;" in page
    _check_inert(page, HOSTILE)


@settings(max_examples=60, deadline=None)
@given(st.text(min_size=1, max_size=300))
def test_any_content_stays_text(text: str) -> None:
    if not text.strip():
        text = "x" + text
    page = render_html(sample_run(text))
    _check_inert(page, text)


def test_view_writes_the_report(tmp_path: Path) -> None:
    run_json = sample_run(HOSTILE).write(tmp_path / "run.json")
    out = tmp_path / "report" / "report.html"
    done = subprocess.run(
        [*HIERPLAN, "view", str(run_json), "--html", str(out)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == f"HTML report: {out}"
    page = out.read_text()
    assert page.startswith("<!DOCTYPE html>") and HOSTILE not in page


def test_view_of_a_bad_record_fails_in_one_line(tmp_path: Path) -> None:
    bad = tmp_path / "run.json"
    bad.write_text(json.dumps({"run_id": 1}))
    done = subprocess.run(
        [*HIERPLAN, "view", str(bad), "--html", str(tmp_path / "r.html")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2
    assert len(done.stderr.strip().splitlines()) == 1
    assert "is not a hierplan run record" in done.stderr
    assert not (tmp_path / "r.html").exists()
    blocker = tmp_path / "blocker"
    blocker.write_text("")
    good = sample_run().write(tmp_path / "good.json")
    done = subprocess.run(
        [*HIERPLAN, "view", str(good), "--html", str(blocker / "r.html")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2
    assert done.stderr.strip() == (
        f"error: cannot create the report's directory {blocker}: {blocker} is a file, not a "
        "directory"
    )


# What a model's answer or a tool's error may hold: an OSC sequence that retitles the window,
# a screen clear, an 8-bit CSI, a bell, a NUL.
TERMINAL_HOSTILE = "\x1b]0;owned\x07\x1b[2J\x9b31m\x00done"


def _terminal_text(result: RunResult) -> str:
    out = io.StringIO()
    Console(file=out, width=200, color_system=None).print(render_run(result))
    return out.getvalue()


def test_the_terminal_report_shows_control_characters_never_sends_them() -> None:
    result = sample_run(TERMINAL_HOSTILE)
    result.model = result.strategy = TERMINAL_HOSTILE
    result.tree.tool = TERMINAL_HOSTILE
    result.tree.plan_versions[0].decided_by = TERMINAL_HOSTILE
    text = _terminal_text(result)
    assert not re.search("[\x00-\x09\x0b-\x1f\x7f-\x9f]", text), repr(text)
    assert "␛]0;owned␇␛[2J" in text  # shown, as symbols


def test_bidirectional_and_control_characters_are_shown_not_obeyed_in_both_reports() -> None:
    # An override would show "cost: $1 \u202e0001$" as "cost: $1 $1000"; a NUL makes text
    # tools take the HTML file for binary.
    spoof = "cost: $1 \u202e0001$ \u2066x\u2069 nul\x00 line\nbreak"
    result = sample_run(spoof)
    page = render_html(result)
    terminal = _terminal_text(result)
    for shown in (page, terminal):
        assert not re.search("[\x00\u202a-\u202e\u2066-\u2069]", shown), repr(shown)
        assert "cost: $1 \ufffd0001$ \ufffdx\ufffd nul" in shown
    assert "line\nbreak" in page  # line breaks in HTML stay: answers are shown as written


def test_view_of_a_record_with_figures_of_an_unknown_shape_fails_in_one_line(
    tmp_path: Path,
) -> None:
    # It passes validation (a run's budget and stats are free-form), but the figures are not
    # the numbers and lists the report expects: written by another version, or by hand.
    data = sample_run().to_dict()
    data["budget"] = {"limit": {"tokens": "lots"}, "spent": {"tokens": 5}}
    data["stats"] = {"priced_as": [1, 2]}
    record = tmp_path / "run.json"
    record.write_text(json.dumps(data))
    done = CliRunner().invoke(app, ["view", str(record)])
    assert done.exit_code == 2, done.output
    assert isinstance(done.exception, SystemExit)  # not a traceback
    (line,) = done.output.strip().splitlines()
    assert line.startswith(f"error: {record} is not a run record this version of hierplan")


def test_budget_figures_are_shown_in_full() -> None:
    result = sample_run()
    result.tree.budget = {"limit_tokens": 50_000_000, "released_tokens": 49_973_764, "usd": 0.5}
    page = render_html(result)
    figures = "limit_tokens=50,000,000, released_tokens=49,973,764, usd=0.5"
    assert f'budget <span class="budget">{figures}</span>' in page  # the root node's


def test_every_status_has_a_colour_of_its_own() -> None:
    page = render_html(sample_run())
    for status in typing.get_args(NodeStatus):  # the run's statuses are among them
        assert f".s-{status}" in page, status


def test_amounts_near_a_dollar_are_shown_as_a_dollar_is() -> None:
    shown = [money(v) for v in (0.99994, 0.99996, 1.0, -0.5, -3.5)]
    assert shown == ["$0.9999", "$1.00", "$1.00", "$-0.5000", "$-3.50"]


def test_the_level_budget_column_shows_the_run_budget_figures_the_terminal_shows(
    tmp_path: Path,
) -> None:
    # Not a sum of every figure of the nodes (limits and releases included, which gave depth 2
    # more than the run's limit): the record's per-level allocated and spent, with a note on
    # why a level's allocations may add up to more than the run's limit.
    result = hierplan.run_sync(
        scenario="data_migration",
        workdir=tmp_path,
        model=hierplan.Simulator(latency_scale=0),
        budget={"tokens": 50_000_000},
    )
    page = render_html(result)
    table = page[page.index('id="levels"') : page.index("</table>", page.index('id="levels"'))]
    assert result.budget is not None
    for row in result.budget["levels"]:
        spent = f"spent {row['spent_tokens']:,} tok"
        assert f"allocated {row['allocated_tokens']:,} tok, {spent}" in table
    assert "limit_tokens" not in table and "released" not in table
    assert html.escape(ALLOCATED_NOTE) in page
    assert ALLOCATED_NOTE in " ".join(_terminal_text(result).split())  # wrapped to the table


def test_view_html_replaces_an_earlier_report_but_no_other_file(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from hierplan.cli import app

    run_json = sample_run().write(tmp_path / "run.json")
    record = run_json.read_bytes()
    notes = tmp_path / "notes.txt"
    notes.write_text("mine")
    for target in (run_json, notes, tmp_path):
        done = CliRunner().invoke(app, ["view", str(run_json), "--html", str(target)])
        assert done.exit_code == 2
        assert " ".join(done.output.split()) == (
            f"error: {target} exists and is not an HTML report, so --html will not replace it: "
            "give --html a new file name (an earlier report is replaced)"
        )
    assert run_json.read_bytes() == record and notes.read_text() == "mine"
    report = tmp_path / "report.html"
    for _ in range(2):  # written, then replaced
        done = CliRunner().invoke(app, ["view", str(run_json), "--html", str(report)])
        assert done.exit_code == 0, done.output
    assert report.read_text().startswith("<!DOCTYPE html>")


def test_the_status_line_says_when_a_succeeded_run_failed_its_verification(
    tmp_path: Path,
) -> None:
    from typer.testing import CliRunner

    from hierplan.cli import app

    result = sample_run()
    result.status = "succeeded"
    shown: dict[bool, str] = {}
    for ok in (True, False):
        result.verification = {"ok": ok, "summary": "3/4 tables match the source"}
        run_json = result.write(tmp_path / f"{ok}.json")
        done = CliRunner().invoke(app, ["view", str(run_json)], env={"COLUMNS": "200"})
        assert done.exit_code == 0, done.output
        shown[ok] = next(line for line in done.output.splitlines() if line.startswith("status: "))
    assert shown == {
        True: "status: succeeded",
        False: "status: succeeded · verification failed (exit 1)",
    }
