"""Run records round-trip through run.json; goal files are validated whole."""

from __future__ import annotations

import copy
import dataclasses
import functools
import inspect
import json
import re
import tempfile
from concurrent.futures import ThreadPoolExecutor
from decimal import Decimal
from pathlib import Path
from typing import Any, Literal

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from rich.console import Console

import hierplan
from hierplan import RunResult, ScriptedModel, tool
from hierplan.core.events import ModelCalled, RunEvent, RunFinished
from hierplan.errors import UserInputError
from hierplan.files import new_directory
from hierplan.models.base import ModelResponse
from hierplan.models.scripted import plan_response
from hierplan.records import KEPT_AS_WRITTEN
from hierplan.redact import redact, redact_data
from hierplan.runner.goals import goal_from_data, load_goal_file
from hierplan.units import Usage
from hierplan.view.html import render_html
from hierplan.view.tree import node_tree

pytestmark = pytest.mark.anyio


@tool
def noop() -> str:
    """Do nothing."""
    return "ok"


async def test_run_json_round_trips(tmp_path: Path) -> None:
    plan = {
        "goal": "g",
        "steps": [{"id": "a", "title": "A", "instruction": "a", "tool": "noop", "args": {}}],
    }
    result = await hierplan.run("g", model=ScriptedModel([plan_response(plan)]), tools=[noop])
    path = result.write(tmp_path / "deep" / "run.json")
    loaded = RunResult.load(path)
    assert loaded.tree == result.tree
    assert loaded.to_dict() == result.to_dict()
    assert loaded.to_dict()["tree"]["subtree_cost_usd"] == result.tree.subtree_cost_usd
    assert not list(path.parent.glob(".run.json.*"))  # no temporary file left behind


@functools.cache
def _one_record() -> RunResult:
    import anyio

    plan = {"goal": "g", "steps": [{"id": "a", "title": "A", "instruction": "say ok"}]}
    model = ScriptedModel([plan_response(plan), ModelResponse(text="ok")])
    return anyio.run(
        lambda: hierplan.run(hierplan.RunSpec(goal="g", model=model, price_in=0.1, price_out=0.3))
    )


def _recorded() -> RunResult:
    """A copy of one run's record (the run is made once; each test changes its own copy)."""
    return copy.deepcopy(_one_record())


@settings(max_examples=60, deadline=None)
@given(
    text=st.text(),
    # Records keep pico-dollars; run.json writes USD floats, which hold every whole
    # pico-dollar exactly up to 10**15 of them ($1,000 a figure; beyond, to the float's precision).
    cost=st.integers(min_value=0, max_value=10**15),
)
def test_run_json_holds_any_text_and_cost_exactly(text: str, cost: int) -> None:
    """run.json is JSON that reads back to the record's dict, whatever text a model or a user
    gave (any script, control characters, quotes; what looks like a credential redacted) and
    whatever cost a call had (in whole pico-dollars, as records keep money; USD in the file)."""
    result = _recorded()
    leaf = result.tree.children[0]
    leaf.goal, leaf.output, result.answer = text, text, text
    leaf.calls[0].cost_pico = cost
    written = result.to_json()
    kept = redact_data(result.to_dict(), keep=KEPT_AS_WRITTEN)
    assert json.loads(written) == kept
    with tempfile.TemporaryDirectory() as where:
        loaded = RunResult.load(result.write(Path(where) / "run.json"))
    assert loaded.to_dict() == kept
    assert loaded.tree.children[0].goal == redact(text)
    assert loaded.tree.children[0].calls[0].cost_pico == cost


async def test_run_json_keeps_cache_writes_and_reads_records_written_before_them(
    tmp_path: Path,
) -> None:
    plan = {"goal": "g", "steps": [{"id": "a", "title": "A", "instruction": "say ok"}]}
    written = Usage(100, 5, cache_write_tokens=60, cache_write_1h_tokens=10)
    model = ScriptedModel([plan_response(plan), ModelResponse(text="ok", usage=written)])
    events: list[RunEvent] = []
    result = await hierplan.run(
        "g", model=model, strategy="plan-execute", listeners=[events.append]
    )
    assert result.tree.children[0].calls[0].usage == written
    called = [e for e in events if isinstance(e, ModelCalled) and e.phase == "execution"]
    assert [(e.cache_write_tokens, e.cache_write_1h_tokens) for e in called] == [(60, 10)]
    totals = result.totals()
    assert (totals["cache_write_tokens"], totals["cache_write_1h_tokens"]) == (60, 10)
    path = result.write(tmp_path / "run.json")
    assert RunResult.load(path).tree == result.tree
    # a record from before cache writes were counted has no such fields: they read as 0
    text = path.read_text()
    for field in ("cache_write_tokens", "cache_write_1h_tokens"):
        text = re.sub(rf',\s*"{field}": \d+', "", text)
    assert "cache_write" not in text
    path.write_text(text)
    old = RunResult.load(path)
    assert old.tree.children[0].calls[0].usage == Usage(100, 5)
    assert old.totals()["cache_write_tokens"] == 0


def test_goal_files(tmp_path: Path) -> None:
    text = tmp_path / "goal.txt"
    text.write_text("  migrate the data \n")
    assert load_goal_file(text).goal == "migrate the data"
    spec = tmp_path / "goal.yaml"
    spec.write_text("scenario: data_migration\nstrategy: dag\nmax_depth: 2\n")
    loaded = load_goal_file(spec)
    assert loaded.overrides() == {"strategy": "dag", "max_depth": 2}
    for content, message in [
        ("- a\n- b\n", "must hold a mapping"),
        ("strategy: dag\n", "give a 'goal' or a 'scenario'"),
        ("goal: g\nmax_depth: 0\n", "max_depth: Input should be greater than or equal to 1"),
        ("goal: g\nstrategy: fast\n", "strategy: Input should be"),
    ]:
        spec.write_text(content)
        with pytest.raises(UserInputError, match=message):
            load_goal_file(spec)
    empty = tmp_path / "empty.txt"
    empty.write_text("\n")
    with pytest.raises(UserInputError, match="give a 'goal'"):
        load_goal_file(empty)


values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=10),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=10), inner, max_size=3)
    ),
    max_leaves=12,
)
fields = st.sampled_from(
    (
        "goal scenario strategy model max_depth concurrency seed extra executor_max_tokens "
        "step_timeout_s retry_backoff_s max_retries"
    ).split()
)


def test_a_goal_file_takes_values_of_their_own_type_and_names_the_keys_allowed(
    tmp_path: Path,
) -> None:
    from hierplan.runner.goals import GOAL_FILE_KEYS

    for text, problem in (
        ("scenario: data_migration\nseed: true\n", "seed: Input should be a valid integer"),
        ('{"scenario": "data_migration", "seed": "3"}', "seed: Input should be a valid integer"),
        ("scenario: data_migration\nseed: -1\n", "seed: Input should be greater than"),
        ("scenario: data_migration\nseed: 2147483648\n", "seed: Input should be less than"),
        ("scenario: data_migration\nmax_depth: '2'\n", "max_depth: Input should be a valid"),
        ("scenario: data_migration\nexecutor_max_tokens: '4096'\n", "executor_max_tokens:"),
        ("scenario: data_migration\nsed: 3\n", f"unknown key 'sed': the keys allowed are "
         f"{', '.join(GOAL_FILE_KEYS)}"),
    ):  # fmt: skip
        spec = tmp_path / "goal.yaml"
        spec.write_text(text)
        with pytest.raises(UserInputError) as caught:
            load_goal_file(spec)
        assert f"goal file {spec} is not a valid goal: {problem}" in str(caught.value)
    spec.write_text("scenario: data_migration\nseed: 2147483647\nstep_timeout_s: 30\n")
    assert load_goal_file(spec).overrides() == {"seed": 2147483647, "step_timeout_s": 30.0}


@settings(max_examples=300)
@given(st.one_of(values, st.dictionaries(fields, values, max_size=5)))
def test_untrusted_goal_data_is_accepted_or_rejected_with_a_message(data: Any) -> None:
    try:
        spec = goal_from_data(data, source="goal")
    except UserInputError as exc:
        assert str(exc).startswith("goal is not a valid goal: ")
    else:
        assert spec.goal is not None or spec.scenario is not None
        # What a goal file accepts, a run takes (model_validate raises otherwise).
        settings = {k: v for k, v in spec.overrides().items() if k != "model"}
        # Values are taken as their own type: no boolean or text read as a number.
        for key, given_value in data.items():
            if key in settings and key not in ("step_timeout_s", "retry_backoff_s"):
                assert type(settings[key]) is type(given_value)
        taken = hierplan.RunSettings.model_validate(settings).model_dump(include=set(settings))
        assert taken == settings


def test_records_are_written_with_the_mode_a_plain_write_gives(tmp_path: Path) -> None:
    import stat

    from hierplan import files as record

    fresh = tmp_path / "run.json"
    record.write_atomic(fresh, "{}")
    # 0666 less the umask (0644 under the usual 022), not the temporary file's 0600
    assert stat.S_IMODE(fresh.stat().st_mode) == 0o666 & ~record._UMASK
    kept = tmp_path / "private.json"
    kept.write_text("old")
    kept.chmod(0o600)
    record.write_atomic(kept, "new")
    assert kept.read_text() == "new" and stat.S_IMODE(kept.stat().st_mode) == 0o600
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []


def test_a_record_reaches_the_disk_before_it_replaces_the_old_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import os

    from hierplan import files as record

    target = tmp_path / "run.json"
    target.write_text("old")
    events: list[str] = []
    real_fsync, real_replace = os.fsync, os.replace

    def fsync(fd: int) -> None:
        # What is synced is the new text, in the temporary file, not yet under the name.
        events.append(f"fsync {os.pread(fd, 100, 0).decode()} while {target.read_text()}")
        real_fsync(fd)

    def replace(src: str | os.PathLike[str], dst: str | os.PathLike[str]) -> None:
        events.append("replace")
        real_replace(src, dst)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "replace", replace)
    record.write_atomic(target, "new")
    assert events == ["fsync new while old", "replace"]
    assert target.read_text() == "new"
    # Not durable (the data migration's counters): the same rename, without the wait.
    events.clear()
    record.write_atomic(target, "newer", durable=False)
    assert events == ["replace"] and target.read_text() == "newer"


async def test_cost_rollups_equal_the_sum_of_the_calls_costs_in_any_order() -> None:
    import math

    events: list[RunEvent] = []
    model = ScriptedModel(
        [
            plan_response(
                hierplan.Plan(
                    goal="g",
                    steps=[
                        hierplan.Step(id=f"s{i}", title="s", instruction="say it") for i in range(3)
                    ],
                )
            ),
            *[ModelResponse(text="ok", usage=Usage(100_001 * (i + 1), 7)) for i in range(3)],
        ]
    )
    spec = hierplan.RunSpec(goal="g", model=model, price_in=0.1, price_out=0.3)
    result = await hierplan.run(spec, strategy="dag", listeners=[events.append])
    costs = [e.cost_usd for e in events if isinstance(e, ModelCalled) and e.cost_usd is not None]
    assert len(costs) == 4
    # Costs are whole pico-dollars, summed exactly: each figure is the nearest float to the
    # exact sum, which floats added one by one need not be.
    pico = sum(round(Decimal(repr(c)) * 10**12) for c in costs)
    exact = pico / 10**12
    data = result.to_dict()
    assert data["totals"]["cost_usd"] == exact == result.totals()["cost_usd"]
    assert data["tree"]["subtree_cost_usd"] == exact == result.tree.subtree_cost_usd
    assert math.fsum(row["cost_usd"] for row in data["levels"]) == pytest.approx(exact)
    (finished,) = [e for e in events if isinstance(e, RunFinished)]
    assert finished.cost_usd == exact
    from hierplan.view.html import render_html

    page = render_html(result)  # the report shows the record's figures to the last digit
    assert f'class="subtree-cost" data-cost="{exact!r}"' in page


@pytest.mark.parametrize("record", [hierplan.RunResult, hierplan.NodeRecord])
def test_the_records_docstrings_say_what_every_field_holds(record: type) -> None:
    doc = inspect.getdoc(record) or ""
    missing = [f.name for f in dataclasses.fields(record) if f"``{f.name}``" not in doc]
    assert missing == [], f"{record.__name__} fields not described: {missing}"


@settings(max_examples=300)
@given(
    st.lists(
        st.tuples(
            st.sampled_from([*hierplan.RunSettings.model_fields, "bogus", ""]),
            st.sampled_from(["=", ":", ""]),
            st.text(max_size=12) | st.integers().map(str) | st.just("null"),
        ).map("".join),
        max_size=4,
    )
)
def test_any_set_assignments_give_valid_settings_or_a_message(texts: list[str]) -> None:
    from hierplan.runner.goals import settings_from_assignments

    try:
        values = settings_from_assignments(texts, flags={"seed": "--seed"})
    except UserInputError as exc:
        assert str(exc).startswith("--set ")
    else:
        assert "seed" not in values
        # what --set accepts, a run takes (model_validate raises otherwise)
        taken = hierplan.RunSettings.model_validate(values).model_dump(include=set(values))
        assert taken == values


async def test_each_tool_call_is_recorded_on_its_node_clipped(tmp_path: Path) -> None:
    @tool
    def shout(text: str) -> str:
        """Shout a text back."""
        if text == "fail":
            raise ValueError("will not shout that")
        return text.upper() * 200  # 400 characters: more than a record keeps

    steps = [
        {"id": "a", "title": "A", "instruction": "a", "tool": "shout", "args": {"text": "hi"}},
        {"id": "b", "title": "B", "instruction": "b", "tool": "shout", "args": {"text": "fail"}},
    ]
    model = ScriptedModel([plan_response({"goal": "g", "steps": steps})])
    settings = hierplan.RunSettings(max_retries=0, max_replans=0)
    result = await hierplan.run(
        "g", model=model, tools=[shout], strategy="plan-execute", settings=settings
    )
    by_step = {n.step_id: n.tool_calls for n in result.tree.walk() if n.step_id}
    [ok] = by_step["a"]
    assert (ok.tool, ok.arguments, ok.error) == ("shout", '{"text": "hi"}', None)
    assert ok.result == "HI" * 150 + "... [100 more]"
    assert ok.duration_s >= 0 and ok.started_at > 0
    [failed] = by_step["b"]
    assert failed.result is None
    assert failed.error == "tool 'shout' failed: ValueError: will not shout that"
    loaded = RunResult.load(result.write(tmp_path / "run.json"))
    assert loaded.tree == result.tree

    page = render_html(result)
    assert '<table class="tool-calls">' in page and "will not shout that" in page
    console = Console(record=True, width=200)
    console.print(node_tree(result.tree))
    text = console.export_text()
    assert 'shout({"text": "hi"}) -> HIHI' in text
    assert 'shout({"text": "fail"}) -> tool \'shout\' failed: ValueError' in text


def test_a_run_json_from_before_tool_calls_were_recorded_loads(tmp_path: Path) -> None:
    result = hierplan.run_sync(
        "g",
        model=ScriptedModel(
            [
                plan_response(
                    {
                        "goal": "g",
                        "steps": [
                            {
                                "id": "a",
                                "title": "A",
                                "instruction": "a",
                                "tool": "noop",
                                "args": {},
                            }
                        ],
                    }
                )
            ]
        ),
        tools=[noop],
    )
    data = result.to_dict()
    for node in [data["tree"], *data["tree"]["children"]]:
        del node["tool_calls"]
    path = tmp_path / "run.json"
    path.write_text(json.dumps(data))
    loaded = RunResult.load(path)
    assert all(n.tool_calls == [] for n in loaded.tree.walk())
    assert loaded.tree.children[0].status == "succeeded"


def test_a_new_directory_never_takes_one_that_exists_even_when_asked_at_once(
    tmp_path: Path,
) -> None:
    assert new_directory(tmp_path / "runs", "20261204-120000", "the run").name == "20261204-120000"
    assert new_directory(tmp_path / "runs", "20261204-120000", "the run").name == (
        "20261204-120000-2"
    )
    # Many threads asking for the same name at the same moment each get their own directory.
    with ThreadPoolExecutor(max_workers=8) as pool:
        made = list(pool.map(lambda _: new_directory(tmp_path / "t", "x", "the run"), range(32)))
    assert len(set(made)) == 32
    assert sorted(p.name for p in (tmp_path / "t").iterdir()) == sorted(p.name for p in made)
    (tmp_path / "file").write_text("")
    with pytest.raises(UserInputError, match=r"cannot create the run .*file is a file"):
        new_directory(tmp_path / "file", "x", "the run")


def _wide_tree(fanout: int, depth: int) -> hierplan.NodeRecord:
    """A tree with ``fanout`` children a node down to ``depth``."""
    root = hierplan.NodeRecord("1", "planner", "root", 1)
    level = [root]
    for d in range(2, depth + 1):
        below = []
        for node in level:
            for i in range(fanout):
                kind: Literal["planner", "executor"] = "executor" if d == depth else "planner"
                child = hierplan.NodeRecord(f"{node.path}.{i + 1}", kind, f"goal {i}", d)
                node.children.append(child)
                below.append(child)
        level = below
    return root


@pytest.mark.parametrize(
    ("fanout", "depth", "max_children", "max_nodes"),
    [(3, 3, 40, 400), (50, 4, 40, 400), (12, 3, 5, 30)],
)
def test_the_printed_tree_is_cut_breadth_first_and_says_what_it_left_out(
    fanout: int, depth: int, max_children: int, max_nodes: int
) -> None:
    root = _wide_tree(fanout, depth)
    console = Console(record=True, width=200)
    console.print(node_tree(root, max_children=max_children, max_nodes=max_nodes))
    lines = console.export_text().splitlines()
    shown = [line for line in lines if " planner " in line or " executor " in line]
    hidden = sum(int(n) for n in re.findall(r"… (\d+) more", "\n".join(lines)))
    total = sum(1 for _ in root.walk())
    assert len(shown) == min(total, max_nodes)
    # Every node is shown or counted in the line of its parent that says how many more.
    assert len(shown) + hidden + _below_hidden(root, lines) == total
    # The levels nearest the root come first: the root's children as far as max_children.
    assert sum(1 for line in shown if re.search(r"(?<![\d.])1\.\d+ ", line)) == min(
        fanout, max_children
    )


def _below_hidden(root: hierplan.NodeRecord, lines: list[str]) -> int:
    """Nodes inside the subtrees of hidden children (counted by none of the 'more' lines)."""
    text = "\n".join(lines)
    shown = set(re.findall(r"(?<![\d.])(1(?:\.\d+)*) (?:planner|executor) ", text))
    inside = 0
    for node in root.walk():
        parent = node.path.rpartition(".")[0]
        if node.path not in shown and parent and parent not in shown:
            inside += 1
    return inside


def test_the_run_view_says_how_many_nodes_its_tree_leaves_out() -> None:
    from hierplan.view.tree import render_run

    result = _recorded()
    result.tree.children[0].children = _wide_tree(30, 3).children
    console = Console(record=True, width=200)
    console.print(render_run(result))
    text = console.export_text()
    total = sum(1 for _ in result.tree.walk())
    assert f"400 of {total:,} nodes shown" in text and "--html" in text
    result.tree.children[0].children = []
    console = Console(record=True, width=200)
    console.print(render_run(result))
    assert "nodes shown" not in console.export_text()
