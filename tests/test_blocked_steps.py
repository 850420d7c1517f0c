"""A step whose tool is blocked (it needs work not done yet) runs once more when the rest of its
plan has ended, instead of failing at once."""

from __future__ import annotations

import sqlite3
from collections.abc import AsyncIterator
from contextlib import closing
from pathlib import Path
from typing import Any

import anyio
import pytest
from test_scheduler import plan_of

import hierplan
from hierplan import Plan, RunResult, ScriptedModel, Step, tool
from hierplan.core.results import StepResult
from hierplan.errors import ModelError, StepFailed, ToolBlocked, ToolError
from hierplan.hierarchy.scheduler import run_dag, run_streamed_dag
from hierplan.models.scripted import plan_response, tool_response
from hierplan.scenarios.data_migration.tools import Databases, make_tools
from hierplan.view.critical_path import run_critical_path

pytestmark = pytest.mark.anyio


class Table:
    """``copy`` is blocked until ``create`` has run; ``create`` waits until ``copy`` was
    refused once, so that the first ``copy`` is always too early, whatever order the two
    start in."""

    def __init__(self, *, created: bool = True) -> None:
        self.can_create = created
        self.made = False
        self.tried = anyio.Event()
        self.runs: dict[str, int] = {}
        self.log: list[str] = []

    async def __call__(self, step: Step, inputs: dict[str, StepResult]) -> StepResult:
        self.runs[step.id] = self.runs.get(step.id, 0) + 1
        self.log.append(step.id)
        if step.id == "copy":
            if not self.made:
                self.tried.set()
                raise StepFailed(f"no table yet (try {self.runs['copy']})", blocked=True)
        elif step.id == "create":
            await self.tried.wait()
            if not self.can_create:
                raise StepFailed("create broke")
            self.made = True
        return StepResult(step.id, step.id)


async def test_a_blocked_step_runs_again_once_the_rest_of_the_plan_has_ended() -> None:
    table = Table()
    outcome = await run_dag(plan_of({"copy": [], "create": [], "check": ["copy"]}), table)
    assert outcome.complete
    assert table.runs == {"copy": 2, "create": 1, "check": 1}
    # Its dependents waited for the second run; nothing ran after the rest had ended but it.
    assert table.log[-3:] == ["create", "copy", "check"]


async def test_a_step_blocked_twice_fails_for_good_and_its_dependents_do_not_run() -> None:
    table = Table(created=False)
    outcome = await run_dag(
        plan_of({"copy": [], "create": [], "other": [], "check": ["copy"]}), table
    )
    assert table.runs == {"copy": 2, "create": 1, "other": 1}
    assert set(outcome.failed) == {"copy", "create"}
    assert str(outcome.failed["copy"]) == "no table yet (try 2)"
    assert outcome.cancelled == {"check": "dependency 'copy' failed"}


async def test_with_stop_on_failure_a_parked_step_keeps_its_failure_and_does_not_rerun() -> None:
    table = Table(created=False)
    outcome = await run_dag(
        plan_of({"copy": [], "create": [], "after_create": ["create"]}),
        table,
        stop_on_failure=True,
    )
    # ``create`` failed for good: nothing starts any more, and the blocked step's failure
    # stands for the replan to see.
    assert table.runs == {"copy": 1, "create": 1}
    assert str(outcome.failed["copy"]) == "no table yet (try 1)"
    assert outcome.blocked == {"copy"}  # it may pass if run again
    assert outcome.not_started == ["after_create"]


@pytest.mark.parametrize("max_running", [None, 1])
async def test_blocked_steps_that_wait_on_each_other_run_again_while_there_is_progress(
    max_running: int | None,
) -> None:
    # addresses needs customers copied, customers needs their table created; the plan made
    # neither wait. Whatever order they run in, each runs again once the other has run.
    tried = {"addresses": anyio.Event(), "customers": anyio.Event()}
    runs: dict[str, int] = {}
    done: set[str] = set()

    async def run_step(step: Step, inputs: dict[str, StepResult]) -> StepResult:
        runs[step.id] = runs.get(step.id, 0) + 1
        need = {"addresses": "customers", "customers": "create"}.get(step.id)
        if need is not None and need not in done:
            tried[step.id].set()
            raise StepFailed(f"{step.id} needs {need}", blocked=True)
        if step.id == "create" and max_running is None:
            await tried["addresses"].wait()
            await tried["customers"].wait()
        done.add(step.id)
        return StepResult(step.id, step.id)

    plan = plan_of({"addresses": [], "customers": [], "create": [], "after": ["addresses"]})
    outcome = await run_dag(plan, run_step, max_running=max_running)
    assert outcome.complete
    assert runs["customers"] == 2 and runs["addresses"] in (2, 3) and runs["after"] == 1


async def test_a_blocked_step_fails_for_good_when_nothing_succeeded_since_it_last_ran() -> None:
    runs = 0

    async def run_step(step: Step, inputs: dict[str, StepResult]) -> StepResult:
        nonlocal runs
        runs += 1
        raise StepFailed(f"blocked, run {runs}", blocked=True)

    outcome = await run_dag(plan_of({"copy": [], "check": ["copy"]}), run_step)
    # Run again once (something may have changed since the plan started), not a third time.
    assert runs == 2 and str(outcome.failed["copy"]) == "blocked, run 2"
    assert outcome.blocked == set() and outcome.cancelled == {"check": "dependency 'copy' failed"}


async def test_a_streamed_plan_runs_a_blocked_step_again_only_once_it_is_whole() -> None:
    table = Table()
    steps = plan_of({"copy": [], "create": []}).steps
    given_create = False

    async def source() -> AsyncIterator[Step]:
        nonlocal given_create
        yield steps[0]
        await table.tried.wait()
        await anyio.wait_all_tasks_blocked()
        # Nothing runs and nothing is ready, but the plan is still being written: the work
        # the blocked step needs may be in the lines to come.
        assert table.runs == {"copy": 1}
        given_create = True
        yield steps[1]

    outcome = await run_streamed_dag(source(), table)
    assert given_create and outcome.complete
    assert table.runs == {"copy": 2, "create": 1}


async def test_a_blocked_step_given_again_by_a_revision_starts_afresh() -> None:
    table = Table(created=False)
    steps = plan_of({"copy": []}).steps

    async def source() -> AsyncIterator[Step]:
        yield steps[0]
        await table.tried.wait()
        table.made = True  # the revision's copy comes after the work it needed
        yield steps[0]

    outcome = await run_streamed_dag(source(), table)
    assert outcome.complete and table.runs == {"copy": 2}


# A run: the plan's copy is made before its table exists (the plan left out the dependency).

made: set[str] = set()
calls: list[str] = []
copy_tried = anyio.Event()


@tool
async def create_table(table: str) -> str:
    """Create a table on the target."""
    calls.append(f"create {table}")
    await copy_tried.wait()
    made.add(table)
    return f"created {table}"


@tool
def copy_rows(table: str) -> str:
    """Copy a table's rows."""
    calls.append(f"copy {table}")
    if table != "t":
        raise ToolError(f"unknown table {table!r}: the source has t", retryable=False)
    if table not in made:
        copy_tried.set()
        raise ToolBlocked(f"the target has no table {table!r}: create it first")
    return f"copied {table}"


def migration(with_create: bool = True, copy: str = "t", *extra: Step) -> Plan:
    steps = [
        Step(id="copy", title="Copy", instruction="copy t", tool="copy_rows", args={"table": copy})
    ]
    if with_create:
        steps.append(
            Step(
                id="create",
                title="Create",
                instruction="create t",
                tool="create_table",
                args={"table": "t"},
            )
        )
    return Plan(goal="migrate t", steps=[*steps, *extra])


async def go(model: ScriptedModel, strategy: str, **settings: Any) -> RunResult:
    global copy_tried
    made.clear()
    calls.clear()
    copy_tried = anyio.Event()
    result = await hierplan.run(
        "migrate t",
        model=model,
        strategy=strategy,
        tools=[create_table, copy_rows],
        settings={"retry_backoff_s": 0, **settings},
    )
    model.assert_complete()
    return result


@pytest.mark.parametrize("strategy", ["dag", "plan-execute"])
async def test_a_run_does_a_blocked_copy_after_the_rest_without_a_replan(strategy: str) -> None:
    model = ScriptedModel([plan_response(migration())])
    result = await go(model, strategy)
    assert result.status == "succeeded"
    # Neither retried at once (it would fail again), nor decided again, nor replanned.
    assert [r.purpose for r in model.requests] == ["plan"]
    assert calls == ["copy t", "create t", "copy t"] or calls == ["create t", "copy t", "copy t"]
    first, create, again = result.tree.children
    assert (first.step_id, first.status, first.attempts) == ("copy", "failed", 1)
    assert first.error == "the target has no table 't': create it first"
    assert first.flags == ["blocked"] and again.flags == []
    assert (create.status, again.step_id, again.status) == ("succeeded", "copy", "succeeded")
    assert again.output == "copied t"


async def test_a_copy_still_blocked_after_the_rest_goes_to_the_replanner() -> None:
    copy_tried.set()
    create, copy = migration().steps[::-1]
    fixed = Plan(
        goal="migrate t", steps=[create, copy.model_copy(update={"depends_on": ["create"]})]
    )
    model = ScriptedModel([plan_response(migration(with_create=False)), plan_response(fixed)])
    result = await go(model, "dag", max_replans=1)
    assert result.status == "succeeded"
    assert [r.purpose for r in model.requests] == ["plan", "replan"]
    # Twice before the replan (once more when nothing else could run), then after the create.
    assert calls[:2] == ["copy t", "copy t"]
    assert "create it first" in model.requests[1].messages[-1].content


async def test_the_migration_tools_say_that_work_not_done_yet_blocks_them(tmp_path: Path) -> None:
    source = tmp_path / "source.db"
    with closing(sqlite3.connect(source)) as conn, conn:
        conn.executescript(
            "CREATE TABLE customers (id INTEGER PRIMARY KEY, name TEXT);"
            "CREATE TABLE addresses (id INTEGER PRIMARY KEY, city TEXT,"
            " customer_id INTEGER NOT NULL REFERENCES customers(id));"
            "INSERT INTO customers VALUES (1, 'Ada'), (2, 'Brian');"
            "INSERT INTO addresses VALUES (1, 'Oslo', 1), (2, 'Lima', 2), (3, 'Pune', 2);"
        )
    tools = {t.name: t for t in make_tools(Databases(source, tmp_path / "target.db"))}
    with pytest.raises(ToolBlocked, match="create it first"):
        await tools["copy_rows"].call({"table": "addresses"})
    with pytest.raises(ToolBlocked, match="create it first"):
        await tools["create_indexes"].call({"table": "addresses"})
    await tools["create_table"].call({"table": "addresses"})
    # Its parent table is not created, then not copied: blocked both times.
    with pytest.raises(ToolBlocked, match="parent rows missing from customers; copy those"):
        await tools["copy_rows"].call({"table": "addresses"})
    await tools["create_table"].call({"table": "customers"})
    with pytest.raises(ToolBlocked, match="parent rows missing from customers; copy those"):
        await tools["copy_rows"].call({"table": "addresses"})
    # Once the parents are there, the same call passes.
    await tools["copy_rows"].call({"table": "customers"})
    assert await tools["copy_rows"].call({"table": "addresses"}) == {
        "table": "addresses",
        "rows": 3,
    }
    check = await tools["verify_table"].call({"table": "addresses"})
    assert check["target_rows"] == check["source_rows"] == 3


async def test_a_call_decided_again_stays_the_steps_when_it_runs_again() -> None:
    plan = migration(copy="tt")  # refused: decided again, then blocked
    model = ScriptedModel([plan_response(plan), tool_response(("copy_rows", {"table": "t"}))])
    result = await go(model, "dag")
    assert result.status == "succeeded"
    # The model was asked once: the second run made the call it decided, not the plan's.
    assert [r.purpose for r in model.requests] == ["plan", "redecide"]
    assert calls.count("copy tt") == 1 and calls.count("copy t") == 2


async def test_with_no_replan_to_be_had_a_parked_step_goes_on_with_the_rest() -> None:
    chk = Step(id="chk", title="Check", instruction="check", tool="copy_rows", args={"table": "x"})
    plan = migration(True, "t", chk)
    model = ScriptedModel([plan_response(plan), ModelError("the planner is down")])
    result = await go(
        model,
        "dag",
        max_replans=1,
        stream_plans=False,
        redecide_tool_calls=False,
        model_retries=0,
        transient_retries=0,
    )
    # ``chk`` failed for good and stopped the plan before the copy ran again; the replan
    # could not be made, so the plan went on without ``chk``: the copy ran again and passed.
    assert [r.purpose for r in model.requests] == ["plan", "replan"]
    assert result.status == "partial"
    copies = [c for c in result.tree.children if c.step_id == "copy"]
    assert [c.status for c in copies] == ["failed", "succeeded"]


async def test_the_critical_path_of_a_step_run_again_goes_through_its_plan() -> None:
    model = ScriptedModel([plan_response(migration())])
    result = await go(model, "dag")
    path = [link.path for link in run_critical_path(result.tree)]
    # The second copy (1.3) waited for the rest of its plan, not for the planning call.
    before = path[path.index("1.3") - 1]
    assert before in ("1.1", "1.2"), path
