"""The HTML report in headless Chromium (Debian's, driven by Playwright): the tree renders,
nodes expand and collapse, the figures match run.json, hostile content runs nothing, and the
timeline draws its bars where their times put them, with the critical path and streamed steps
marked."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from e2e_support import hierplan, ran
from timeline_support import CRITICAL_CALLS, CRITICAL_NODES, STREAMED, TIMED, timeline_run

from hierplan.view.html import write_html
from hierplan.view.tree import money

pytestmark = pytest.mark.e2e

CHROMIUM = Path("/usr/bin/chromium")
FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
HOSTILE = (
    '<script>window.__pwned = 1</script><img src=x onerror="window.__pwned = 2">'
    '<svg onload="window.__pwned = 3"></svg>"\'><b>bold?</b>'
)


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    if not CHROMIUM.exists():
        pytest.fail("Chromium is missing: apt-get install -y chromium (.ci/run does)")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        pytest.fail("playwright is missing: pip install -e '.[dev,e2e]' (make e2e does)")
    with sync_playwright() as playwright:
        found = playwright.chromium.launch(executable_path=str(CHROMIUM), args=FLAGS)
        yield found
        found.close()


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, Any], Path]:
    """A real demo run, its run.json and the report of it."""
    where = tmp_path_factory.mktemp("demo")
    hierplan("demo", "--sim-latency-scale", "0", "-o", str(where / "demo"))
    run_json = where / "demo" / "run.json"
    report = where / "report.html"
    hierplan("view", str(run_json), "--html", str(report))
    return json.loads(run_json.read_text()), report


class Page:
    """A page with every request, console message and dialog recorded."""

    def __init__(self, browser: Any, path: Path) -> None:
        self.page = browser.new_page()
        self.requests: list[str] = []
        self.console: list[tuple[str, str]] = []
        self.dialogs: list[str] = []
        self.page.on("request", lambda r: self.requests.append(r.url))
        self.page.on("console", lambda m: self.console.append((m.type, m.text)))
        self.page.on("dialog", self._dismiss)
        self.page.goto(path.as_uri())
        self.page.wait_for_load_state("load")

    def _dismiss(self, dialog: Any) -> None:
        self.dialogs.append(dialog.message)
        dialog.dismiss()

    def summary(self, path: str) -> Any:
        return self.page.locator(f'details.node[data-path="{path}"] > summary')


def _nodes(tree: dict[str, Any]) -> Iterator[dict[str, Any]]:
    stack = [tree]
    while stack:
        node = stack.pop()
        yield node
        stack.extend(node["children"])


def test_the_tree_renders_with_every_node_and_nothing_external(
    browser: Any, demo: tuple[dict[str, Any], Path]
) -> None:
    record, report = demo
    view = Page(browser, report)
    nodes = list(_nodes(record["tree"]))
    assert view.page.locator("details.node").count() == len(nodes) == record["totals"]["nodes"]
    assert view.summary("1").is_visible()
    assert view.page.locator("#run-goal").inner_text() == record["goal"]
    # depth 1 and 2 start open, so depth-3 summaries show; their bodies start closed
    leaf = next(n for n in nodes if n["depth"] == 3)
    assert view.summary(leaf["path"]).is_visible()
    assert not view.page.locator(f'details.node[data-path="{leaf["path"]}"] > .body').is_visible()
    # the timeline shows the nodes that started; a step a revised plan dropped before it
    # started is in the tree (cancelled) but has no bar
    started = [n for n in nodes if n["started_at"] is not None]
    assert all(n["status"] == "cancelled" for n in nodes if n["started_at"] is None)
    assert view.page.locator("#timeline tr.tl-row").count() == len(started)
    assert view.requests == [report.as_uri()]
    assert [m for m in view.console if m[0] == "error"] == []


def test_nodes_expand_and_collapse(browser: Any, demo: tuple[dict[str, Any], Path]) -> None:
    record, report = demo
    view = Page(browser, report)
    middle = next(n for n in _nodes(record["tree"]) if n["depth"] == 2 and n["children"])
    child = middle["children"][0]["path"]
    assert view.summary(child).is_visible()
    view.summary(middle["path"]).click()  # collapse
    assert not view.summary(child).is_visible()
    assert view.summary(middle["path"]).is_visible()
    view.summary(middle["path"]).click()  # expand again
    assert view.summary(child).is_visible()
    leaf_body = view.page.locator(f'details.node[data-path="{child}"] > .body')
    assert not leaf_body.is_visible()
    view.summary(child).click()
    assert leaf_body.is_visible()
    # the page's own script works under its Content-Security-Policy
    view.page.click("#collapse-all")
    assert view.summary("1").is_visible() and not view.summary(middle["path"]).is_visible()
    view.page.click("#expand-all")
    for node in _nodes(record["tree"]):
        assert view.summary(node["path"]).is_visible(), node["path"]
    assert [m for m in view.console if m[0] == "error"] == []


def test_cost_figures_match_run_json(browser: Any, demo: tuple[dict[str, Any], Path]) -> None:
    record, report = demo
    view = Page(browser, report)
    view.page.click("#expand-all")
    shown = view.page.evaluate(
        """() => Array.from(document.querySelectorAll('details.node')).map(d => {
            const s = d.querySelector(':scope > summary');
            const own = s.querySelector('.cost'), sub = s.querySelector('.subtree-cost');
            return {path: d.dataset.path, own: own.textContent, ownData: own.dataset.cost,
                    sub: sub.textContent, subData: sub.dataset.cost,
                    tokens: s.querySelector('.tokens').textContent};
        })"""
    )
    by_path = {row["path"]: row for row in shown}
    for node in _nodes(record["tree"]):
        row = by_path[node["path"]]
        assert row["own"] == money(node["cost_usd"])
        assert float(row["ownData"]) == node["cost_usd"]
        assert row["sub"] == money(node["subtree_cost_usd"])
        assert float(row["subData"]) == node["subtree_cost_usd"]
        tokens = node["usage"]["input_tokens"] + node["usage"]["output_tokens"]
        assert row["tokens"] == f"{tokens:,} tok"
    for level in record["levels"]:
        cell = view.page.locator(f'#levels tr[data-depth="{level["depth"]}"] td.level-cost')
        assert cell.inner_text() == money(level["cost_usd"])
        assert float(cell.get_attribute("data-cost")) == level["cost_usd"]
    total = view.page.locator("#total-cost")
    assert total.inner_text() == money(record["totals"]["cost_usd"])
    assert float(total.get_attribute("data-cost")) == record["totals"]["cost_usd"]


def test_a_hostile_goal_runs_nothing(
    browser: Any, demo: tuple[dict[str, Any], Path], tmp_path: Path
) -> None:
    record, _ = demo
    record = json.loads(json.dumps(record))
    record["goal"] = record["answer"] = HOSTILE
    for node in _nodes(record["tree"]):
        node["goal"] = node["output"] = HOSTILE
        if node["status"] != "succeeded":
            node["error"] = HOSTILE
        for version in node["plan_versions"]:
            version["note"] = HOSTILE
            for step in version["plan"]["steps"]:
                step["title"] = step["instruction"] = HOSTILE
    run_json = tmp_path / "run.json"
    run_json.write_text(json.dumps(record))
    report = tmp_path / "report.html"
    hierplan("view", str(run_json), "--html", str(report))
    view = Page(browser, report)
    view.page.click("#expand-all")
    view.page.wait_for_timeout(300)
    assert view.page.evaluate("window.__pwned") is None
    assert view.dialogs == []
    assert view.page.locator("#run-goal").inner_text() == HOSTILE
    assert view.page.locator("img, svg").count() == 0
    bold = "Array.from(document.querySelectorAll('b')).filter(b => b.textContent === 'bold?')"
    assert view.page.evaluate(bold + ".length") == 0
    assert view.requests == [report.as_uri()]


BARS = """() => Array.from(document.querySelectorAll('#timeline div.bar')).map(b => {
    const box = b.getBoundingClientRect(), style = getComputedStyle(b);
    return {path: b.closest('tr').dataset.path, call: b.dataset.call ?? null,
            classes: Array.from(b.classList), left: box.left, right: box.right,
            width: box.width, outline: style.outlineStyle, image: style.backgroundImage};
})"""


def _bars(view: Page) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = view.page.evaluate(BARS)
    return found


def _node_bars(bars: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {bar["path"]: bar for bar in bars if bar["call"] is None}


def test_the_timeline_draws_bars_in_time_order_with_the_critical_path_and_streaming(
    browser: Any, tmp_path: Path
) -> None:
    report = write_html(timeline_run(), tmp_path / "report.html")
    view = Page(browser, report)
    bars = _bars(view)
    assert bars and all(bar["width"] > 0 for bar in bars)
    nodes = _node_bars(bars)
    # by start: each node's bar begins right of the one that started before it
    lefts = [nodes[path]["left"] for path in TIMED]
    assert lefts == sorted(lefts) and len(set(lefts)) == len(lefts)
    assert nodes["1.3"]["left"] >= nodes["1.2"]["right"]  # c waited for b
    outlined = {(bar["path"], bar["call"]) for bar in bars if bar["outline"] == "solid"}
    marked = {(bar["path"], bar["call"]) for bar in bars if "crit" in bar["classes"]}
    wanted = {(path, None) for path in CRITICAL_NODES} | {(p, str(i)) for p, i in CRITICAL_CALLS}
    assert outlined == marked == wanted
    named = view.page.get_by_role("img", name=re.compile("on the critical path"))
    assert named.count() == len(wanted)
    # the streamed step starts left of the end of the root's planning call, striped; the
    # step after it (b) starts right of that end, plain
    call = next(bar for bar in bars if bar["path"] == "1" and bar["call"] == "0")
    assert nodes[STREAMED]["left"] < call["right"] <= nodes["1.2"]["left"]
    assert "repeating-linear-gradient" in nodes[STREAMED]["image"]
    assert [p for p, bar in nodes.items() if bar["image"] != "none"] == [STREAMED]
    streamed = view.page.get_by_role("img", name=re.compile("started while its plan"))
    assert streamed.count() == 1
    assert [m for m in view.console if m[0] == "error"] == []


def test_a_real_runs_timeline_marks_a_critical_path_from_start_to_end(
    browser: Any, demo: tuple[dict[str, Any], Path]
) -> None:
    record, report = demo
    view = Page(browser, report)
    bars = _bars(view)
    nodes = _node_bars(bars)
    assert set(nodes) == set(ran(record["tree"]))
    assert all(bar["width"] > 0 for bar in bars)
    planners = {n["path"] for n in _nodes(record["tree"]) if n["kind"] == "planner"}
    drawn = {bar["path"] for bar in bars if "planning" in bar["classes"]}
    assert drawn == planners & set(nodes)
    critical = [bar for bar in bars if "crit" in bar["classes"]]
    assert all(bar["outline"] == "solid" for bar in critical)
    # the path ends with the root, and its first planning call is the root's plan
    assert "crit" in nodes["1"]["classes"]
    first = min((bar for bar in critical if bar["call"] is not None), key=lambda b: b["left"])
    assert (first["path"], first["call"]) == ("1", "0")
    assert len({bar["path"] for bar in critical}) >= 3
