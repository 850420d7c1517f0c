"""``hierplan run --pause-for-review`` and ``hierplan resume`` end to end, for each decision."""

from __future__ import annotations

import json
import os
import shlex
import signal
import sqlite3
import subprocess
import sys
import time
from contextlib import closing
from pathlib import Path
from typing import Any

import pytest
import yaml
from review_support import migration_dir, source_db
from typer.testing import CliRunner

import hierplan as hierplan_api
from hierplan.agents.prompts import parse_plan_prompt
from hierplan.cli import app
from hierplan.durable.checkpoint import CHECKPOINT_FILE, PENDING_DIR, RESUMING_FILE
from hierplan.durable.lock import RUN_LOCK, lock_directory
from hierplan.models.base import ModelRequest, ModelResponse
from hierplan.models.scripted import FunctionModel
from hierplan.review import PauseForReview
from hierplan.scenarios.data_migration.database import ROWS

__all__ = ["source_db"]

runner = CliRunner()
PAUSED = 3


def hierplan(*args: str | Path) -> tuple[int, str]:
    result = runner.invoke(app, [str(a) for a in args], env={"COLUMNS": "200"})
    return result.exit_code, result.output


def start(run_dir: Path, *extra: str) -> tuple[int, str]:
    return hierplan(
        "run",
        "--scenario",
        "data_migration",
        "--pause-for-review",
        "-o",
        run_dir,
        "--sim-latency-scale",
        "0",
        "--sim-profile",
        "ideal",
        *extra,
    )


def record(run_dir: Path) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((run_dir / "run.json").read_text())
    return data


def tables(run_dir: Path) -> list[str]:
    with closing(sqlite3.connect(run_dir / "target.db")) as conn:
        return [r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")]


def history(version: dict[str, Any]) -> list[tuple[str, str]]:
    return [(h["decision"], h["by"]) for h in version["history"]]


@pytest.fixture
def paused(tmp_path: Path, source_db: Path) -> Path:
    """A data-migration run paused at its root plan: nothing has run."""
    run_dir = migration_dir(source_db, tmp_path / "mig")
    code, out = start(run_dir)
    assert code == PAUSED, out
    assert "paused: 1 plan(s) wait for a decision: node 1" in out
    assert "continue with: hierplan resume" in out
    assert record(run_dir)["status"] == "paused"
    assert tables(run_dir) == []
    assert (run_dir / CHECKPOINT_FILE).exists() and (run_dir / PENDING_DIR / "1.yaml").exists()
    assert (
        "# SIMULATED: proposed by the offline simulator."
        in (run_dir / PENDING_DIR / "1.yaml").read_text()
    )
    return run_dir


def test_resume_approve(paused: Path) -> None:
    code, out = hierplan("resume", paused, "--approve", "--by", "alice (TICKET-42)")
    assert code == 0, out
    assert "wall time of this resume " in out  # not the run's, which counts the pause too
    data = record(paused)
    assert data["status"] == "succeeded" and data["verification"]["ok"]
    root = data["tree"]["plan_versions"]
    assert [history(v) for v in root] == [[("pending", "pause"), ("approved", "alice (TICKET-42)")]]
    assert not (paused / CHECKPOINT_FILE).exists()
    assert not (paused / RESUMING_FILE).exists()
    assert not (paused / PENDING_DIR).exists()
    code, out = hierplan("resume", paused, "--approve")
    assert code == 2 and "not paused" in out
    code, out = hierplan("view", paused / "run.json")
    assert code == 0
    assert "Plan reviews (audit trail)" in out
    assert "alice (TICKET-42)" in out and "pending" in out


def test_resume_exports_a_trace_of_what_it_runs(paused: Path) -> None:
    spans_file = paused.parent / "spans.jsonl"
    code, out = hierplan("resume", paused, "--approve", "--trace", f"jsonl={spans_file}")
    assert code == 0, out
    spans = [json.loads(line) for line in spans_file.read_text().splitlines()]
    (workflow,) = [s for s in spans if s["parent_span_id"] is None]
    # Its rollups are the record's, which counts the calls made before the pause as well.
    totals = record(paused)["totals"]
    assert workflow["attributes"]["gen_ai.aggregated_usage.cost"] == totals["cost_usd"]
    assert any(s["name"].startswith("execute_tool") for s in spans)


def test_the_resumed_run_s_trace_links_to_the_paused_run_s(source_db: Path, tmp_path: Path) -> None:
    run_dir = migration_dir(source_db, tmp_path / "mig")
    before, after = tmp_path / "paused.jsonl", tmp_path / "resumed.jsonl"
    code, out = start(run_dir, "--trace", f"jsonl={before}")
    assert code == PAUSED, out
    code, out = hierplan("resume", run_dir, "--approve", "--trace", f"jsonl={after}")
    assert code == 0, out
    (paused,) = [s for s in _lines(before) if s["parent_span_id"] is None]
    (resumed,) = [s for s in _lines(after) if s["parent_span_id"] is None]
    assert paused["links"] == []
    assert resumed["links"] == [
        {
            "trace_id": paused["trace_id"],
            "span_id": paused["span_id"],
            "attributes": {"hierplan.link.reason": "resumed from pause"},
        }
    ]
    assert resumed["trace_id"] != paused["trace_id"]
    assert paused["attributes"]["hierplan.run.status"] == "paused"
    assert resumed["attributes"]["hierplan.run.status"] == "succeeded"


def _lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_resume_reject_then_approve(paused: Path) -> None:
    reason = "index and verify each group as soon as it is copied"
    code, out = hierplan("resume", paused, "--reject", reason)
    assert code == PAUSED, out
    assert "node 1: plan v2 replaces v1" in out
    assert "changes: +8 -2 ~0" in out and "+ verify_catalog [subgoal]" in out
    assert tables(paused) == []
    pending_text = (paused / PENDING_DIR / "1.yaml").read_text()
    pending = yaml.safe_load(pending_text)
    assert "verify_orders" in [s["id"] for s in pending["steps"]]
    assert f"hierplan resume {paused} --approve --node 1 --version 2" in pending_text
    # a decision made on version 1 (say, by a reviewer who read the file before) is refused
    code, out = hierplan("resume", paused, "--approve", "--version", "1")
    assert code == 2 and "node 1 waits on plan version 2, not 1" in out, out
    assert (paused / CHECKPOINT_FILE).exists()  # nothing changed
    code, out = hierplan("resume", paused, "--approve", "--node", "1", "--version", "2")
    assert code == 0, out
    data = record(paused)
    versions = data["tree"]["plan_versions"]
    assert [(v["reason"], v["decision"], v["note"]) for v in versions] == [
        ("initial", "rejected", reason),
        ("retry", "approved", ""),
    ]
    assert versions[1]["diff"]["removed"] == ["indexes", "verify"]
    assert data["verification"]["ok"]


def test_resume_with_an_edited_plan(paused: Path, tmp_path: Path) -> None:
    plan = yaml.safe_load((paused / PENDING_DIR / "1.yaml").read_text())
    plan["steps"].insert(
        0,
        {
            "id": "inventory",
            "title": "List the source tables",
            "instruction": "List the source tables with their row counts",
            "tool": "list_tables",
            "args": {},
        },
    )
    edited = tmp_path / "edited.yaml"
    edited.write_text(yaml.safe_dump(plan, sort_keys=False))
    code, out = hierplan("resume", paused, "--plan", edited, "--by", "bob")
    assert code == 0, out
    data = record(paused)
    versions = data["tree"]["plan_versions"]
    assert [(v["reason"], v["decision"], v["decided_by"]) for v in versions] == [
        ("initial", "edited", "bob"),
        ("edit", "approved", "bob"),
    ]
    assert versions[1]["diff"]["added"] == ["inventory"]
    listed = [n for n in data["tree"]["children"] if n["tool"] == "list_tables"]
    assert [n["status"] for n in listed] == ["succeeded"]
    assert data["verification"]["ok"]


def test_an_edited_plan_that_fails_and_is_replanned_pauses_again_with_its_diff(
    paused: Path, tmp_path: Path
) -> None:
    """The replan replaces the edited plan that ran: the printout diffs against that one."""
    plan = yaml.safe_load((paused / PENDING_DIR / "1.yaml").read_text())
    plan["steps"] = [{"id": "a", "title": "A", "instruction": "do a thing no oracle knows"}]
    edited = tmp_path / "edited.yaml"
    edited.write_text(yaml.safe_dump(plan))
    code, out = hierplan("resume", paused, "--plan", edited, "--node", "1")
    assert code == PAUSED, out
    assert "Traceback" not in out
    versions = record(paused)["tree"]["plan_versions"]
    assert [v["reason"] for v in versions] == ["initial", "edit", "replan"]
    assert "node 1: plan v3 replaces v2" in out
    assert "  - a [" in out  # the edited plan's step, removed by the replan
    # A later pause of the same node prints as well.
    code, out = hierplan("resume", paused, "--reject", "try again")
    assert code == PAUSED, out
    assert "Traceback" not in out and "node 1: plan v4 replaces v3" in out


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ("cycle", "dependency cycle among steps: schema -> copy_reference"),
        ("tool", "step 'wipe' uses tool 'drop_database', which is unknown or not allowed"),
        ("schema", "is not a valid plan: steps.0.depends_on"),
    ],
)
def test_resume_refuses_a_bad_plan_and_keeps_the_checkpoint(
    paused: Path, tmp_path: Path, change: str, message: str
) -> None:
    plan = yaml.safe_load((paused / PENDING_DIR / "1.yaml").read_text())
    if change == "cycle":
        plan["steps"][0]["depends_on"] = ["verify"]
    elif change == "tool":
        plan["steps"].append(
            {"id": "wipe", "title": "Wipe", "instruction": "Drop", "tool": "drop_database"}
        )
    else:
        plan["steps"][0]["depends_on"] = "verify"
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump(plan))
    before = (paused / CHECKPOINT_FILE).read_text()
    code, out = hierplan("resume", paused, "--plan", bad)
    assert code == 2
    assert message in out and "Traceback" not in out
    assert (paused / CHECKPOINT_FILE).read_text() == before
    assert tables(paused) == []


def test_resume_refuses_a_plan_for_another_goal(paused: Path, tmp_path: Path) -> None:
    plan = yaml.safe_load((paused / PENDING_DIR / "1.yaml").read_text())
    saved_goal = plan["goal"]
    plan["goal"] = "Summarise the Q3 incident reports"
    other = tmp_path / "other.yaml"
    other.write_text(yaml.safe_dump(plan))
    before = (paused / CHECKPOINT_FILE).read_text()
    code, out = hierplan("resume", paused, "--plan", other)
    assert code == 2 and "Traceback" not in out
    line = " ".join(out.split())
    assert "'Summarise the Q3 incident reports', but node 1 waits on a plan for" in line
    assert "pass the plan saved for that node (pending/1.yaml, edited)" in line
    assert (paused / CHECKPOINT_FILE).read_text() == before
    assert not (paused / RESUMING_FILE).exists() and tables(paused) == []
    # The saved goal, wrapped again by an editor, is the same goal.
    plan["goal"] = "\n  ".join(saved_goal.split(" "))
    other.write_text(yaml.safe_dump(plan))
    code, out = hierplan("resume", paused, "--plan", other)
    assert code == 0, out


def test_a_run_directory_is_written_by_one_process_at_a_time(paused: Path) -> None:
    before = (paused / CHECKPOINT_FILE).read_text()
    held = lock_directory(paused, RUN_LOCK, what="the run directory", wait="wait")
    try:
        # Held by this (test) process: the message says so rather than "another process".
        busy = f"{paused} is in use by another run in this process (process {os.getpid()})"
        code, out = hierplan("resume", paused, "--approve")
        assert code == 2 and busy in " ".join(out.split()), out
        code, out = start(paused)  # a new run there would clear the checkpoint
        assert code == 2 and busy in " ".join(out.split()), out
        assert "give this run another --out" in " ".join(out.split())
    finally:
        held.release()
    assert (paused / CHECKPOINT_FILE).read_text() == before and tables(paused) == []
    code, out = hierplan("resume", paused, "--approve")
    assert code == 0, out
    assert not (paused / RUN_LOCK).exists()  # let go of, and deleted, at the end


def test_resume_flags_are_checked(paused: Path) -> None:
    assert hierplan("resume", paused)[0] == 2
    code, out = hierplan("resume", paused, "--approve", "--reject", "x")
    assert code == 2 and "only one of" in out
    code, out = hierplan("resume", paused, "--reject", " ")
    assert code == 2 and "needs a reason" in out
    code, out = hierplan("resume", paused, "--approve", "--node", "1.4")
    assert code == 2 and "node 1.4 has no pending plan; pending: 1" in out
    code, out = hierplan("resume", paused, "--approve", "--yes", "--review")
    assert code == 2 and "choose one of --yes, --review and --pause-for-review" in out
    code, out = hierplan("resume", paused, "--approve", "--review")
    assert code == 2 and "needs a terminal" in out
    code, out = hierplan("resume", paused.parent / "nowhere", "--approve")
    assert code == 2 and "not a paused run directory" in out
    assert tables(paused) == []


def test_run_flags_are_checked(tmp_path: Path) -> None:
    code, out = start(tmp_path / "x", "--review-policy", "sometimes")
    assert code == 2 and "unknown review policy 'sometimes'" in out
    code, out = hierplan("run", "--scenario", "data_migration", "-o", tmp_path / "y")
    assert code == 2 and "--pause-for-review" in out
    code, out = hierplan("demo", "--review", "-o", tmp_path / "z")
    assert code == 2 and "needs a terminal" in out


def test_every_level_paused_and_resumed_until_done(tmp_path: Path, source_db: Path) -> None:
    """Policy ``all``: each round decides every plan waiting; running steps are never rerun."""
    run_dir = migration_dir(source_db, tmp_path / "all")
    code, out = start(run_dir, "--review-policy", "all", "--sim-profile", "ideal")
    rounds = [record(run_dir)["tree"]["plan_versions"][0]["decision"]]
    while code == PAUSED:
        pending = json.loads((run_dir / CHECKPOINT_FILE).read_text())["pending"]
        assert pending, out
        code, out = hierplan("resume", run_dir, "--approve", "--by", f"round-{len(rounds)}")
        rounds.append(",".join(pending))
        assert len(rounds) < 20, out
    assert code == 0, out
    data = record(run_dir)
    assert data["verification"]["ok"]
    planners = [n for n in _walk(data["tree"]) if n["plan_versions"]]
    assert len(planners) == 8
    for node in planners:
        decisions = history(node["plan_versions"][0])
        assert decisions[0] == ("pending", "pause") and decisions[-1][0] == "approved"
    assert "1.3,1.4" in rounds  # the two copies that become ready together wait together
    leaves = [n for n in _walk(data["tree"]) if n["kind"] == "executor"]
    assert {n["status"] for n in leaves} == {"succeeded"}
    goals = [n["goal"] for n in leaves]
    assert len(goals) == len(set(goals)) == 14 * 3 + 4  # nothing ran twice


def _walk(node: dict[str, Any]) -> list[dict[str, Any]]:
    out = [node]
    for child in node["children"]:
        out.extend(_walk(child))
    return out


def test_budget_threshold_pauses_only_for_costly_subgoals(tmp_path: Path, source_db: Path) -> None:
    """``tokens>5000``: the root plan, then the sub-goals whose estimate is above 5,000 tokens."""
    run_dir = migration_dir(source_db, tmp_path / "budget")
    code, out = start(run_dir, "--review-policy", "tokens>5000", "--sim-profile", "ideal")
    waited: list[list[str]] = []
    while code == PAUSED:
        waited.append(json.loads((run_dir / CHECKPOINT_FILE).read_text())["pending"])
        code, out = hierplan("resume", run_dir, "--approve")
        assert len(waited) < 10, out
    assert code == 0, out
    data = record(run_dir)
    estimates = {n["path"]: n["step_id"] for n in data["tree"]["children"]}
    assert [[estimates.get(p, p) for p in w] for w in waited] == [
        ["1"],
        ["copy_reference"],  # 5,500 tokens
        ["copy_orders"],  # 5,500
        ["verify"],  # 8,000
    ]
    auto = {
        n["step_id"]
        for n in data["tree"]["children"]
        if n["plan_versions"] and n["plan_versions"][0]["decided_by"].startswith("auto")
    }
    assert auto == {"schema", "copy_customers", "copy_catalog", "indexes"}  # 4,000 each
    assert data["verification"]["ok"]
    # Copies ran in three of the five processes; the counters add up over all of them.
    assert data["verification"]["details"]["rows_copied"] == sum(ROWS.values())


def test_a_new_run_in_the_directory_forgets_the_paused_one_once_its_checkpoint_is_deleted(
    paused: Path,
) -> None:
    """Starting over in a paused run's directory, as the refusal says (see the test below):
    the new run clears what is left of the paused one (its pending plans)."""
    (paused / CHECKPOINT_FILE).unlink()
    args: list[str | Path] = ["run", "--scenario", "data_migration", "--yes", "-o", paused]
    args += ["--sim-latency-scale", "0"]
    code, out = hierplan(*args)
    assert code == 2 and "give --overwrite to replace it" in out  # the paused run's record
    code, out = hierplan(*args, "--overwrite")
    assert code == 0, out
    assert not (paused / CHECKPOINT_FILE).exists() and not (paused / PENDING_DIR).exists()
    code, out = hierplan("resume", paused, "--approve")
    assert code == 2 and "not paused" in out


def test_the_commands_to_continue_work_when_pasted_for_a_directory_with_spaces(
    tmp_path: Path, source_db: Path
) -> None:
    run_dir = migration_dir(source_db, tmp_path / "my runs" / "migration é")
    code, out = start(run_dir)
    assert code == PAUSED, out
    shown = next(line for line in out.splitlines() if line.startswith("continue with: "))
    pasted = shlex.split(shown.removeprefix("continue with: ").split(" | ")[0])
    assert pasted == ["hierplan", "resume", str(run_dir), "--approve"]
    pending = (run_dir / PENDING_DIR / "1.yaml").read_text()
    approve = next(line for line in pending.splitlines() if line.startswith("# Approve: "))
    command = shlex.split(approve.removeprefix("# Approve: "))
    assert command[:3] == ["hierplan", "resume", str(run_dir)]
    code, out = hierplan(*command[1:])
    assert code == 0, out
    assert record(run_dir)["verification"]["ok"]


def _one_step_planner() -> FunctionModel:
    """A planner (a model object, not a name) that lists the source tables."""

    def answer(request: ModelRequest) -> ModelResponse:
        prompt = parse_plan_prompt(request.messages)
        assert prompt is not None
        step = {"id": "list", "title": "List", "instruction": "List the tables"}
        plan = {"goal": prompt.goal, "steps": [{**step, "tool": "list_tables", "args": {}}]}
        return ModelResponse(output=plan, text="")

    return FunctionModel(answer, name="one-step")


def test_a_run_paused_with_a_model_object_is_not_resumed_on_another_model(
    tmp_path: Path, source_db: Path
) -> None:
    run_dir = migration_dir(source_db, tmp_path / "object")
    paused = hierplan_api.run_sync(
        scenario="data_migration",
        model=_one_step_planner(),
        approver=PauseForReview(),
        workdir=run_dir,
        checkpoint_dir=run_dir,
    )
    assert paused.status == "paused"
    before = (run_dir / CHECKPOINT_FILE).read_text()
    code, out = hierplan("resume", run_dir, "--approve")
    assert code == 2, out
    assert "started in Python with a model object" in out and "hierplan.resume(" in out
    assert (run_dir / CHECKPOINT_FILE).read_text() == before
    assert not (run_dir / "run.json").exists()


@pytest.mark.parametrize("command", ["run", "demo"])
def test_a_new_run_in_a_paused_runs_directory_is_refused_and_the_pause_kept(
    paused: Path, command: str
) -> None:
    pending = (paused / PENDING_DIR / "1.yaml").read_text()
    scenario = ["--scenario", "data_migration"] if command == "run" else []
    code, out = hierplan(command, *scenario, "--yes", "-o", paused, "--sim-latency-scale", "0")
    assert code == 2, out
    assert f"{paused} holds a paused run waiting for a decision" in " ".join(out.split())
    assert f"hierplan resume {shlex.quote(str(paused))}" in out
    if command == "run":  # the paused run's record is replaced only when told to
        assert "first and give --overwrite" in " ".join(out.split())
    # nothing of the paused run is lost: it still resumes
    assert (paused / PENDING_DIR / "1.yaml").read_text() == pending
    assert record(paused)["status"] == "paused"
    code, out = hierplan("resume", paused, "--approve")
    assert code == 0, out
    assert record(paused)["status"] == "succeeded"


@pytest.mark.parametrize(
    ("sig", "code", "reason"),
    [(signal.SIGINT, 130, "interrupted (Ctrl-C)"), (signal.SIGTERM, 143, "stopped by SIGTERM")],
)
def test_a_resume_stopped_by_ctrl_c_or_sigterm_says_which(
    tmp_path: Path, source_db: Path, sig: signal.Signals, code: int, reason: str
) -> None:
    run_dir = migration_dir(source_db, tmp_path / "mig")
    assert start(run_dir, "--sim-latency-scale", "1")[0] == PAUSED  # a resumed run that takes time
    proc = subprocess.Popen(
        [sys.executable, "-m", "hierplan", "resume", str(run_dir), "--approve"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 60
    while not (run_dir / RESUMING_FILE).exists() and time.monotonic() < deadline:
        time.sleep(0.1)  # the resume has claimed the checkpoint
    time.sleep(1.0)
    proc.send_signal(sig)
    stdout, stderr = proc.communicate(timeout=60)
    assert proc.returncode == code, stderr
    assert "Traceback" not in stdout + stderr
    assert not (run_dir / RUN_LOCK).exists()
    # The record says what happened since the pause, and the checkpoint stays for going on anyway.
    kept = f"the checkpoint it resumed from is kept ({RESUMING_FILE})"
    assert f"{reason}: the run was cancelled; {kept}" in " ".join(stdout.split())
    assert record(run_dir)["status"] == "cancelled"
    assert (run_dir / RESUMING_FILE).exists() and not (run_dir / CHECKPOINT_FILE).exists()
    code, out = hierplan("resume", run_dir, "--approve")
    assert code == 2 and f"rename {RESUMING_FILE} to {CHECKPOINT_FILE}" in " ".join(out.split())


def test_a_resume_whose_record_cannot_be_saved_keeps_its_checkpoint(paused: Path) -> None:
    (paused / "run.json").unlink()
    (paused / "run.json").mkdir()  # where the record should go
    code, out = hierplan("resume", paused, "--approve")
    assert code == 1 and "Traceback" not in out
    line = " ".join(out.split())
    assert f"error: the run record could not be written to {paused / 'run.json'}" in line
    assert f"the checkpoint it resumed from is kept ({RESUMING_FILE})" in line
    assert (paused / RESUMING_FILE).exists()


def test_a_resume_whose_files_are_damaged_says_so_and_stays_paused(paused: Path) -> None:
    before = (paused / CHECKPOINT_FILE).read_text()
    (paused / "target.db").write_bytes(b"not a database" * 100)
    code, out = hierplan("resume", paused, "--approve")
    assert code == 2 and "Traceback" not in out, out
    line = " ".join(out.split())
    assert f"error: the paused run in {paused} could not be set up again (" in line
    assert "were its files changed or damaged since it paused?" in line
    assert (paused / CHECKPOINT_FILE).read_text() == before
    assert not (paused / RESUMING_FILE).exists()
