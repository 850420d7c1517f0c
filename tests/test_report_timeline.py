"""The HTML report's timeline without a browser: a row a timed node, planning calls and model
calls as bars, the critical path and streamed steps marked in classes and words, the limits."""

from __future__ import annotations

from html.parser import HTMLParser

import pytest
from timeline_support import (
    CRITICAL_CALLS,
    CRITICAL_NODES,
    STREAMED,
    TIMED,
    model_call,
    timeline_run,
)

from hierplan.view import html
from hierplan.view.html import render_html


class Bars(HTMLParser):
    """The timeline's rows (paths, in order) and bars (row, classes, call index, label)."""

    def __init__(self) -> None:
        super().__init__()
        self.rows: list[str] = []
        self.bars: list[tuple[str, set[str], int | None, str]] = []
        self.inside = False

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        found = dict(attrs)
        if tag == "table":
            self.inside = found.get("id") == "timeline"
        if not self.inside:
            return
        if tag == "tr" and found.get("class") == "tl-row":
            self.rows.append(found["data-path"] or "")
        classes = set((found.get("class") or "").split())
        if tag == "div" and "bar" in classes:
            call = found.get("data-call")
            assert found["title"] == found["aria-label"]
            label = found["title"] or ""
            self.bars.append((self.rows[-1], classes, None if call is None else int(call), label))

    def handle_endtag(self, tag: str) -> None:
        if tag == "table":
            self.inside = False


def bars_of(page: str) -> Bars:
    parser = Bars()
    parser.feed(page)
    return parser


def test_a_row_a_timed_node_with_its_calls_as_bars() -> None:
    found = bars_of(render_html(timeline_run()))
    assert found.rows == TIMED
    nodes = [(row, c) for row, c, call, _ in found.bars if call is None]
    assert [row for row, _ in nodes] == TIMED
    assert all("node" in c for _, c in nodes)
    planning = {(row, call) for row, c, call, _ in found.bars if "planning" in c}
    assert planning == {("1", 0), ("1.2", 0)}
    marks = [(row, call) for row, c, call, _ in found.bars if "mark" in c]
    assert marks == [("1.1", 0), ("1.1", 1)]
    kinds = {row: c for row, c in nodes}
    assert "k-planner" in kinds["1.2"] and "k-executor" in kinds["1.2.1"]


def test_the_critical_path_bars_are_marked_in_a_class_and_in_words() -> None:
    found = bars_of(render_html(timeline_run()))
    critical = [(row, call) for row, c, call, _ in found.bars if "crit" in c]
    wanted = [(path, None) for path in CRITICAL_NODES] + CRITICAL_CALLS
    assert sorted(critical, key=str) == sorted(wanted, key=str)
    for row, classes, call, label in found.bars:
        assert ("on the critical path" in label) == ("crit" in classes), (row, call)


def test_a_step_started_while_its_plan_was_written_is_streamed() -> None:
    found = bars_of(render_html(timeline_run()))
    streamed = [(row, label) for row, c, call, label in found.bars if "streamed" in c]
    assert streamed == [
        (
            STREAMED,
            f"{STREAMED} (executor, succeeded): 2.500 s; started while its plan was being "
            "written (the planning call of 1 ended 0.500 s later)",
        )
    ]
    assert sum("started while its plan" in label for *_, label in found.bars) == 1


def test_bars_sit_on_one_axis_from_the_first_start_to_the_last_end() -> None:
    page = render_html(timeline_run())
    assert "0 to 10.000 s" in page
    # the root's call: 0 to 1 of 10 s; step c: 6.1 to 9.9
    assert 'data-call="0" style="left:0.000%;width:10.000%"' in page
    assert 'style="left:61.000%;width:38.000%"' in page


def test_the_rows_and_calls_drawn_are_limited(monkeypatch: pytest.MonkeyPatch) -> None:
    result = timeline_run()
    leaf = result.tree.find("1.2.1")
    for i in range(html.CALLS_PER_ROW_LIMIT + 5):
        leaf.add_call(model_call(2.2 + i / 1000, 0.0005, "execute", "execution"))
    found = bars_of(render_html(result))
    assert sum(row == "1.2.1" and call is not None for row, _, call, _ in found.bars) == 200
    monkeypatch.setattr(html, "TIMELINE_LIMIT", 4)
    page = render_html(result)
    assert bars_of(page).rows == TIMED[:4]
    assert "2 more nodes not shown." in page


def test_call_purposes_are_escaped_in_bar_labels() -> None:
    result = timeline_run()
    result.tree.calls[0].purpose = '"><script>window.__pwned = 1</script>'
    page = render_html(result)
    assert "<script>window" not in page
    assert "&quot;&gt;&lt;script&gt;window.__pwned = 1&lt;/script&gt;" in page
    assert page.count("<script>") == 1


def test_a_run_without_timings_has_no_timeline() -> None:
    result = timeline_run()
    for node in result.nodes():
        node.started_at = node.finished_at = None
    assert "No node has timings." in render_html(result)
