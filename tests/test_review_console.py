"""The console reviewer in real pseudo-terminals (pexpect), and its one-at-a-time lock.

Set ``HIERPLAN_TRANSCRIPTS=DIR`` to keep what each session showed (ANSI codes removed).
"""

from __future__ import annotations

import io
import json
import os
import re
import sqlite3
import subprocess
import sys
import threading
import time
from contextlib import closing
from pathlib import Path
from typing import Any

import pexpect
import pytest
from review_support import (
    ROOT_GOAL,
    fanout_planner,
    migration_dir,
    part_goal,
    recording_tool,
    source_db,
)
from rich.console import Console

import hierplan
from hierplan.review import ConsoleReviewer, PolicyApprover
from hierplan.review import console as console_module

__all__ = ["source_db"]

HIERPLAN = str(Path(sys.executable).with_name("hierplan"))
ANSI = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]|\x1b[()][A-Z0-9]|\r")
PROMPT = r"Decision \[a/e/r/q\]"
EDITOR = """\
#!{python}
import os, sys, yaml
path = sys.argv[1]
state = os.environ["EDIT_STATE"]
modes = os.environ["EDIT_MODES"].split(",")
used = int(open(state).read()) if os.path.exists(state) else 0
open(state, "w").write(str(used + 1))
mode = modes[min(used, len(modes) - 1)]
data = yaml.safe_load(open(path))
if mode == "add":
    data["steps"].insert(0, {{"id": "inventory", "title": "List the source tables",
        "instruction": "List the source tables with their row counts",
        "tool": "list_tables", "args": {{}}}})
elif mode == "cycle":
    data["steps"][0]["depends_on"] = ["verify"]
elif mode == "tool":
    data["steps"].append({{"id": "wipe", "title": "Drop the source",
        "instruction": "Drop every table", "tool": "drop_database", "args": {{}}}})
open(path, "w").write(yaml.safe_dump(data, sort_keys=False))
"""


class Session:
    """``hierplan run --review`` (or ``demo --review``) in a pseudo-terminal, with what it
    showed as plain text."""

    def __init__(self, tmp: Path, source: Path, *args: str, demo: bool = False, **env: str) -> None:
        self.dir = migration_dir(source, tmp / "run")
        self.log = io.StringIO()
        environ = dict(os.environ, TERM="xterm-256color", NO_COLOR="1", COLUMNS="110", **env)
        start = ["demo"] if demo else ["run", "--scenario", "data_migration"]
        command = [*start, "--review", "-o", str(self.dir)]
        self.child = pexpect.spawn(
            HIERPLAN,
            [*command, "--sim-latency-scale", "0", *args],
            env=environ,
            dimensions=(50, 110),
            encoding="utf-8",
            timeout=90,
        )
        self.child.logfile_read = self.log
        self.mark = 0

    def expect(self, pattern: str) -> str:
        """Wait for ``pattern``; return the plain text shown since the last call."""
        self.child.expect(pattern)
        return self.since_last()

    def since_last(self) -> str:
        text = ANSI.sub("", self.log.getvalue())
        shown, self.mark = text[self.mark :], len(text)
        return shown

    def send(self, line: str) -> None:
        self.child.sendline(line)

    def finish(self, name: str) -> int:
        """Wait for the end; keep the transcript if asked; the exit status."""
        self.child.expect(pexpect.EOF)
        self.child.close()
        keep = os.environ.get("HIERPLAN_TRANSCRIPTS")
        if keep:
            Path(keep).mkdir(parents=True, exist_ok=True)
            Path(keep, f"{name}.txt").write_text(ANSI.sub("", self.log.getvalue()))
        assert self.child.exitstatus is not None, self.log.getvalue()[-2000:]
        return int(self.child.exitstatus)

    def record(self) -> dict[str, Any]:
        data: dict[str, Any] = json.loads((self.dir / "run.json").read_text())
        return data


def flat(text: str) -> str:
    """Text as words: tree glyphs dropped and whitespace collapsed (lines wrap in a terminal)."""
    return " ".join(re.sub(r"[├└]──|│", " ", text).split())


def shows(expected: str, shown: str) -> bool:
    """Whether ``shown`` has ``expected``, however the terminal wrapped it."""
    return flat(expected) in flat(shown)


def _editor(tmp: Path, modes: str) -> dict[str, Any]:
    script = tmp / "editor.py"
    script.write_text(EDITOR.format(python=sys.executable))
    script.chmod(0o755)
    return {"EDITOR": str(script), "EDIT_MODES": modes, "EDIT_STATE": str(tmp / "edits")}


def _target_tables(run_dir: Path) -> list[str]:
    with closing(sqlite3.connect(run_dir / "target.db")) as conn:
        return [r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")]


def _executors(record: dict[str, Any]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    stack = [record["tree"]]
    while stack:
        node = stack.pop()
        if node["kind"] == "executor":
            out.append(node)
        stack.extend(node["children"])
    return out


def test_approve_in_the_demo(tmp_path: Path, source_db: Path) -> None:
    session = Session(tmp_path, source_db, demo=True)
    shown = session.expect(PROMPT)
    assert shows(
        "Review: plan for node 1 (root), version 1 (initial) [SIMULATED: proposed by the offline "
        "simulator]",
        shown,
    )
    assert shows("wave 3 (2 in parallel)", shown)
    # A sub-goal's title is the start of its text: a planner writes no titles.
    assert shows("copy_catalog [subgoal] Copy the rows of tables", shown)
    assert shows("after schema, copy_reference  est. 4,000 tok", shown)
    assert shows("a approve   e edit   r reject   q quit", shown)
    session.send("a")
    assert session.finish("approve") == 0
    record = session.record()
    root = record["tree"]["plan_versions"]
    assert [(v["decision"], v["decided_by"]) for v in root] == [
        ("approved", f"console:{console_module.reviewer_name()}")
    ]
    assert record["verification"]["ok"]


def test_edit_in_editor(tmp_path: Path, source_db: Path) -> None:
    session = Session(tmp_path, source_db, **_editor(tmp_path, "add"))
    session.expect(PROMPT)
    session.send("e")
    shown = session.expect(r"Decision \[a/e/d/r/q\]")
    assert shows("Edited plan is valid.", shown)
    assert shows("changes: +1 -0 ~0 (added: inventory)", shown)
    assert shows("+ inventory [task] List the source tables  tool=list_tables {}", shown)
    assert shows("wave 1 (2 in parallel)", shown)
    session.send("a")
    assert session.finish("edit") == 0
    record = session.record()
    versions = record["tree"]["plan_versions"]
    assert [(v["reason"], v["decision"]) for v in versions] == [
        ("initial", "edited"),
        ("edit", "approved"),
    ]
    assert versions[1]["diff"]["added"] == ["inventory"]
    listed = [n for n in _executors(record) if n["tool"] == "list_tables"]
    assert [n["status"] for n in listed] == ["succeeded"]
    assert record["verification"]["ok"]


def test_refused_edits_run_nothing(tmp_path: Path, source_db: Path) -> None:
    session = Session(tmp_path, source_db, **_editor(tmp_path, "cycle,tool"))
    session.expect(PROMPT)
    session.send("e")
    shown = session.expect(r"Decision \[e/d/q\]")
    assert shows("The edited plan was refused:", shown)
    assert shows("dependency cycle among steps: schema -> copy_reference", shown)
    session.send("e")
    shown = session.expect(r"Decision \[e/d/q\]")
    assert shows(
        "step 'wipe' uses tool 'drop_database', which is unknown or not allowed here", shown
    )
    session.send("q")
    assert session.finish("refused") == 3
    record = session.record()
    assert record["status"] == "paused"
    assert _executors(record) == []
    assert _target_tables(session.dir) == []
    versions = record["tree"]["plan_versions"]
    assert [(v["reason"], v["decision"]) for v in versions] == [
        ("initial", "pending"),
        ("edit", "invalid"),
        ("edit", "invalid"),
    ]
    assert any("drop_database" in p for p in versions[2]["problems"])
    assert (session.dir / "pending" / "1.yaml").exists()


def test_reject_with_a_reason_shows_the_new_plan_and_its_diff(
    tmp_path: Path, source_db: Path
) -> None:
    reason = "index and verify each group as soon as it is copied"
    # The ideal profile: the revised plan is the oracle's answer to the reason, without the
    # simulated errors a plan written after a rejection may carry, so its diff is known.
    session = Session(tmp_path, source_db, "--sim-profile", "ideal")
    session.expect(PROMPT)
    session.send("r")
    session.expect("Why reject it")
    session.send(reason)
    shown = session.expect(PROMPT)
    assert shows("version 2 (retry)", shown)
    assert shows(f"replaces the previous proposal, which was rejected: {reason}", shown)
    assert shows("changes: +8 -2 ~0 (added: indexes_reference, verify_reference", shown)
    assert shows("+ verify_orders [subgoal] Verify tables orders", shown)
    assert shows("after indexes_orders", shown)
    assert shows("- verify [subgoal] Verify tables addresses", shown)
    session.send("a")
    assert session.finish("reject") == 0
    # The new plan verifies the orders group (five tables) on its own.
    assert shows("verify_orders: verified 5 tables (", session.log.getvalue())
    record = session.record()
    versions = record["tree"]["plan_versions"]
    assert [(v["reason"], v["decision"], v["note"]) for v in versions] == [
        ("initial", "rejected", reason),
        ("retry", "approved", ""),
    ]
    assert record["verification"]["ok"]


def test_every_level_reviewed_one_at_a_time_with_replan_diffs(
    tmp_path: Path, source_db: Path
) -> None:
    # Plans' failed tool calls go to replans (not decided again), so that replans come to
    # be reviewed.
    session = Session(
        tmp_path, source_db, "--review-policy", "all", "--set", "redecide_tool_calls=false"
    )
    shown_all = ""
    reviews = 0
    while session.child.expect([PROMPT, pexpect.EOF]) == 0:
        shown = session.since_last()
        shown_all += shown
        assert flat(shown).count("plan review: node") == 1  # one question at a time
        reviews += 1
        session.send("a")
    assert session.finish("every-level") == 0
    record = session.record()
    by_console = [
        (n["path"], v["version"])
        for n in _walk(record["tree"])
        for v in n["plan_versions"]
        if v["decided_by"].startswith("console:")
    ]
    assert len(by_console) == reviews >= 8  # root, seven sub-goals, and their replans
    assert len(set(by_console)) == reviews  # none asked twice, none lost
    assert shows("This plan replaces the running plan (a replan)", shown_all)
    # the replan's diff against the plan it replaces (which steps depends on the seeded noise)
    assert re.search(r"changes: \+\d+ -\d+ ~\d+ \((added|removed|changed): ", flat(shown_all))
    assert record["verification"]["ok"]


def _walk(node: dict[str, Any]) -> list[dict[str, Any]]:
    out = [node]
    for child in node["children"]:
        out.extend(_walk(child))
    return out


@pytest.mark.anyio
async def test_concurrent_reviews_wait_their_turn(monkeypatch: pytest.MonkeyPatch) -> None:
    """Six sub-goals reach the gate together; their reviews never overlap, none is lost."""
    parts = 6
    guard = threading.Lock()
    active = peak = 0
    asked: list[str] = []
    original = console_module._Session.run

    def tracked(self: Any) -> Any:
        nonlocal active, peak
        with guard:
            active += 1
            peak = max(peak, active)
            asked.append(self.ctx.path)
        time.sleep(0.02)  # room for an unserialised review to overlap
        try:
            return original(self)
        finally:
            with guard:
                active -= 1

    monkeypatch.setattr(console_module._Session, "run", tracked)
    screen = Console(file=io.StringIO(), width=120, color_system=None)
    reviewer = ConsoleReviewer(screen, stream=io.StringIO("a\n" * (parts + 1)), who="tess")
    calls: list[str] = []
    result = await hierplan.run(
        ROOT_GOAL,
        model=fanout_planner(parts),
        tools=[recording_tool(calls)],
        approver=PolicyApprover(reviewer, "all"),
    )
    assert result.status == "succeeded", result.error
    assert peak == 1
    assert sorted(asked) == sorted(["1", *(f"1.{i}" for i in range(1, parts + 1))])
    assert sorted(calls) == sorted(part_goal(i) for i in range(1, parts + 1))
    assert {v.decided_by for n in result.nodes() for v in n.plan_versions} == {"console:tess"}
    assert screen.file.getvalue().count("plan review: node") == parts + 1  # type: ignore[attr-defined]


@pytest.mark.anyio
async def test_a_replan_is_not_shown_as_the_answer_to_an_earlier_rejection() -> None:
    from hierplan import Plan, ScriptedModel, Step, tool
    from hierplan.models.scripted import plan_response

    @tool
    def add(a: int, b: int) -> int:
        """Add."""
        return a + b

    @tool
    def broken(x: int) -> int:
        """Fail."""
        raise RuntimeError("broken")

    def plan(last: Step) -> Plan:
        first = Step(id="x", title="x", instruction="x", tool="add", args={"a": 1, "b": 1})
        return Plan(goal="g", steps=[first, last])

    y = Step(id="y", title="y", instruction="y", depends_on=["x"], tool="broken", args={"x": 0})
    z = Step(
        id="z", title="z", instruction="z", depends_on=["x"], tool="add", args={"a": 1, "b": 1}
    )
    screen = Console(file=io.StringIO(), width=140, color_system=None)
    # reject v1 with a reason, approve v2 (whose step y fails), approve the replan v3
    reviewer = ConsoleReviewer(screen, stream=io.StringIO("r\ntoo risky\na\na\n"), who="tess")
    v1, v2, v3 = plan(y), plan(y.model_copy(update={"args": {"x": 1}})), plan(z)
    model = ScriptedModel([plan_response(v1), plan_response(v2), plan_response(v3)])
    settings = hierplan.RunSettings(retry_backoff_s=0, max_retries=0)
    result = await hierplan.run(
        "g", model=model, tools=[add, broken], approver=reviewer, strategy="dag", settings=settings
    )
    assert result.status == "succeeded"
    shown = screen.file.getvalue()  # type: ignore[attr-defined]
    retry, replan = shown.split("plan review: node 1")[2:]
    assert "replaces the previous proposal, which was rejected: too risky" in flat(retry)
    assert "This plan replaces the running plan (a replan)" in flat(replan)
    assert "too risky" not in replan


@pytest.mark.anyio
async def test_closed_input_pauses(tmp_path: Path) -> None:
    screen = Console(file=io.StringIO(), width=120, color_system=None)
    reviewer = ConsoleReviewer(screen, stream=io.StringIO(""), who="tess")
    result = await hierplan.run(
        ROOT_GOAL,
        model=fanout_planner(2),
        tools=[recording_tool([])],
        approver=reviewer,
        checkpoint_dir=tmp_path,
    )
    assert result.status == "paused"
    assert result.tree.plan_versions[0].note == "input closed at the console"
    assert "Input closed: pausing for hierplan resume." in screen.file.getvalue()  # type: ignore[attr-defined]


def test_resume_asks_at_the_console(tmp_path: Path, source_db: Path) -> None:
    """A run paused for review elsewhere, decided at a terminal with ``resume --review``."""
    run_dir = migration_dir(source_db, tmp_path / "run")
    paused = subprocess.run(
        [
            *(HIERPLAN, "run", "--scenario", "data_migration", "--pause-for-review"),
            *("-o", str(run_dir), "--sim-latency-scale", "0"),
        ],
        capture_output=True,
        timeout=90,
    )
    assert paused.returncode == 3
    child = pexpect.spawn(
        HIERPLAN,
        ["resume", str(run_dir), "--review"],
        env=dict(os.environ, TERM="xterm-256color", NO_COLOR="1", COLUMNS="110"),
        dimensions=(50, 110),
        encoding="utf-8",
        timeout=90,
    )
    log = io.StringIO()
    child.logfile_read = log
    child.expect(PROMPT)
    assert shows(
        "Review: plan for node 1 (root), version 1 (initial)", ANSI.sub("", log.getvalue())
    )
    child.sendline("a")
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 0, log.getvalue()[-2000:]
    record = json.loads((run_dir / "run.json").read_text())
    history = [(h["decision"], h["by"]) for h in record["tree"]["plan_versions"][0]["history"]]
    assert history == [
        ("pending", "pause"),
        ("approved", f"console:{console_module.reviewer_name()}"),
    ]
    assert record["verification"]["ok"]


FLAKY_EDITOR = """\
import os, sys, yaml
path, state = sys.argv[1], os.environ["EDIT_STATE"]
used = int(open(state).read()) if os.path.exists(state) else 0
open(state, "w").write(str(used + 1))
data = yaml.safe_load(open(path))
if used == 0:  # an edit the gate refuses: a step with an unknown tool
    data["steps"].append({"id": "extra", "title": "Extra", "instruction": "Record the extra",
        "tool": "no_such_tool", "args": {"text": "extra"}})
elif used == 1:  # the editor fails (vi's :cq, a crash)
    sys.exit(1)
else:  # the fix: the right tool, on whatever this edit starts from
    for step in data["steps"]:
        if step.get("tool") == "no_such_tool":
            step["tool"] = "record"
open(path, "w").write(yaml.safe_dump(data, sort_keys=False))
"""


async def review_with_editor(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, editor: str, keys: str, width: int
) -> tuple[str, hierplan.RunResult, list[str]]:
    """A run of ROOT_GOAL whose root plan is reviewed at the console with ``keys``, the plan
    editor being the Python script ``editor`` (which keeps a count of its uses in EDIT_STATE):
    what the screen showed, the result, and the tool calls made."""
    script = tmp_path / "editor.py"
    script.write_text(editor)
    monkeypatch.setenv("EDIT_STATE", str(tmp_path / "edits"))
    screen = Console(file=io.StringIO(), width=width, color_system=None)
    reviewer = ConsoleReviewer(
        screen, editor=f"{sys.executable} {script}", stream=io.StringIO(keys), who="tess"
    )
    calls: list[str] = []
    result = await hierplan.run(
        ROOT_GOAL,
        model=fanout_planner(2),
        tools=[recording_tool(calls)],
        approver=PolicyApprover(reviewer, "root"),
    )
    return screen.file.getvalue(), result, calls  # type: ignore[attr-defined]


@pytest.mark.anyio
async def test_a_refused_edit_is_kept_when_the_editor_then_fails(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # edit (refused), edit again (the editor fails), edit (fixed), approve the edited plan
    shown, result, calls = await review_with_editor(
        tmp_path, monkeypatch, FLAKY_EDITOR, "e\ne\ne\na\n", 120
    )
    assert "The editor exited with status 1" in shown
    assert "The refused edit is kept for your next edit." in shown
    assert result.status == "succeeded", shown[-2000:]
    assert sorted(calls) == ["Collect part 1", "Collect part 2", "extra"]
    versions = result.tree.plan_versions
    assert [(v.reason, v.decision) for v in versions] == [
        ("initial", "edited"),
        ("edit", "invalid"),
        ("edit", "approved"),
    ]


UNREADABLE_EDITOR = """\
import os, sys
path, state = sys.argv[1], os.environ["EDIT_STATE"]
used = int(open(state).read()) if os.path.exists(state) else 0
open(state, "w").write(str(used + 1))
if used == 0:  # nested deeper than a parser's recursion goes
    open(path, "w").write("[" * 100_000 + "]" * 100_000)
else:  # a second steps key, which would silently replace the first
    open(path, "w").write("goal: g\\nsteps: [{id: a, title: A, instruction: x}]\\nsteps: []\\n")
"""


@pytest.mark.anyio
async def test_an_unreadable_edit_is_refused_and_the_review_goes_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # edit (too deep), edit again (a key twice), discard, approve the proposed plan
    shown, result, calls = await review_with_editor(
        tmp_path, monkeypatch, UNREADABLE_EDITOR, "e\ne\nd\na\n", 200
    )
    assert "the edited plan is nested too deeply to read" in shown
    assert "key 'steps' appears twice in one mapping" in shown
    assert result.status == "succeeded", shown[-2000:]
    assert sorted(calls) == ["Collect part 1", "Collect part 2"]


SLOW_EDITOR = """\
#!{python}
import pathlib, signal, sys, time
signal.signal(signal.SIGINT, signal.SIG_IGN)  # as vi does: Ctrl-C leaves insert mode
pathlib.Path(sys.argv[0]).with_name("editing").touch()
time.sleep(2)
plan = pathlib.Path(sys.argv[1])
import yaml
data = yaml.safe_load(plan.read_text())
assert data["steps"][0]["title"].startswith("Create the schema")
data["steps"][0]["title"] = "Schema first"
plan.write_text(yaml.safe_dump(data, sort_keys=False))
"""


@pytest.mark.parametrize("command", ["run", "resume"])
def test_ctrl_c_typed_in_the_plan_editor_does_not_stop_the_run(
    tmp_path: Path, source_db: Path, command: str
) -> None:
    run_dir = migration_dir(source_db, tmp_path / "run")
    editor = tmp_path / "editor.py"
    editor.write_text(SLOW_EDITOR.format(python=sys.executable))
    editor.chmod(0o755)
    quick = ("--sim-latency-scale", "0", "--sim-profile", "ideal")
    start = ["run", "--scenario", "data_migration", "-o", str(run_dir), *quick]
    if command == "resume":
        paused = subprocess.run([HIERPLAN, *start, "--pause-for-review"], timeout=90)
        assert paused.returncode == 3
        start = ["resume", str(run_dir)]
    child = pexpect.spawn(
        HIERPLAN,
        [*start, "--review"],
        env=dict(os.environ, TERM="xterm-256color", NO_COLOR="1", EDITOR=str(editor)),
        dimensions=(50, 110),
        encoding="utf-8",
        timeout=90,
    )
    log = io.StringIO()
    child.logfile_read = log
    child.expect(PROMPT)
    child.sendline("e")
    deadline = time.monotonic() + 30
    while not (tmp_path / "editing").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    child.sendintr()  # the terminal sends it to the editor and to hierplan alike
    child.expect(r"Decision \[a/e/d/r/q\]")
    child.sendline("a")
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 0, ANSI.sub("", log.getvalue())[-2000:]
    versions = json.loads((run_dir / "run.json").read_text())["tree"]["plan_versions"]
    assert [(v["decision"], v["plan"]["steps"][0]["title"][:17]) for v in versions] == [
        ("edited", "Create the schema"),  # the start of the sub-goal's text
        ("approved", "Schema first"),
    ]


def test_a_run_whose_output_is_not_a_terminal_does_not_wait_unseen_for_a_review(
    tmp_path: Path, source_db: Path
) -> None:
    """``hierplan run ... > run.log`` at a terminal: the question would go to the file."""
    run_dir = migration_dir(source_db, tmp_path / "run")
    command = [HIERPLAN, "run", "--scenario", "data_migration", "-o", str(run_dir)]
    command += ["--sim-latency-scale", "0", "--sim-profile", "ideal"]
    leader, follower = os.openpty()  # the terminal the input comes from
    try:
        refused = subprocess.run(
            command, stdin=follower, capture_output=True, text=True, timeout=30
        )
        assert refused.returncode == 2, refused.stdout[-2000:]
        assert "the output does not go to a terminal" in refused.stderr
        assert "--review to be asked anyway" in refused.stderr
        assert not (run_dir / "run.json").exists()
        os.write(leader, b"a\n")  # asked for: the question goes with the output (| tee, say)
        asked = subprocess.run(
            [*command, "--review"], stdin=follower, capture_output=True, text=True, timeout=90
        )
    finally:
        os.close(leader)
        os.close(follower)
    assert asked.returncode == 0, asked.stdout[-2000:]
    assert "Decision [a/e/r/q]" in asked.stdout
    assert json.loads((run_dir / "run.json").read_text())["verification"]["ok"]
