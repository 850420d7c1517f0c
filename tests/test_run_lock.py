"""The run directory's lock through the Python API: ``hierplan.run`` with a ``checkpoint_dir``
and ``hierplan.resume`` hold it as ``hierplan run``, ``demo`` and ``resume`` do, and the
command line, which holds it while it calls them, is not refused by its own run."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path
from typing import Any

import anyio
import pytest
from batch_support import config, text_goals
from review_support import ROOT_GOAL, fanout_planner, migration_dir, recording_tool, source_db
from typer.testing import CliRunner

import hierplan
from hierplan import Approve, CallbackApprover, GateContext, Plan
from hierplan.batch import run_batch
from hierplan.batch.journal import LOCK as BATCH_LOCK
from hierplan.batch.journal import Journal
from hierplan.cli import app
from hierplan.core.events import RunEvent
from hierplan.durable.checkpoint import CHECKPOINT_FILE, PENDING_DIR, RESUMING_FILE
from hierplan.durable.lock import RUN_LOCK, lock_directory
from hierplan.errors import ModelAuthError, UserInputError
from hierplan.models.base import ModelRequest, ModelResponse
from hierplan.models.scripted import FunctionModel
from hierplan.review import PauseForReview

__all__ = ["source_db"]

PAUSED = 3

# The command line's own hold on a run directory, in a process of its own.
CLI_HOLDS = """
import sys
from pathlib import Path
from hierplan.cli.running import holding
with holding(Path(sys.argv[1]), otherwise=""):
    print("held", flush=True)
    sys.stdin.read()
"""


@contextmanager
def held_elsewhere(run_dir: Path) -> Iterator[int]:
    """The command line's lock on ``run_dir``, held by another process (its id) for the body."""
    with subprocess.Popen(
        [sys.executable, "-c", CLI_HOLDS, str(run_dir)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    ) as holder:
        try:
            assert holder.stdout is not None and holder.stdout.readline() == "held\n"
            yield holder.pid
        finally:
            holder.send_signal(signal.SIGKILL)
            holder.wait()


def free(run_dir: Path) -> bool:
    """Whether nothing holds ``run_dir``'s lock (and its lock file is gone)."""
    if (run_dir / RUN_LOCK).exists():
        return False
    lock_directory(run_dir, RUN_LOCK, what="the run directory", wait="").release()
    return True


def lock_seen(run_dir: Path, seen: list[str]) -> Any:
    """A listener that keeps, at each event, which process the lock file names."""

    def listen(event: RunEvent) -> None:
        path = run_dir / RUN_LOCK
        seen.append(path.read_text() if path.exists() else "")

    return listen


def busy(run_dir: Path, holder: str, then: str) -> str:
    return f"{run_dir} is in use by {holder}, which holds its lock run.lock: {then}"


def common() -> dict[str, Any]:
    return {"model": fanout_planner(2), "tools": [recording_tool([])]}


@pytest.mark.anyio
async def test_a_second_library_run_on_a_directory_is_refused_while_the_first_runs(
    tmp_path: Path,
) -> None:
    waiting, go_on = anyio.Event(), anyio.Event()

    async def review(plan: Plan, ctx: GateContext) -> Approve:
        waiting.set()
        await go_on.wait()
        return Approve(by="test")

    results: list[hierplan.RunResult] = []

    async def first() -> None:
        approver = CallbackApprover(review)
        results.append(
            await hierplan.run(ROOT_GOAL, approver=approver, checkpoint_dir=tmp_path, **common())
        )

    async with anyio.create_task_group() as group:
        group.start_soon(first)
        await waiting.wait()
        assert (tmp_path / RUN_LOCK).read_text() == str(os.getpid())
        here = f"another run in this process (process {os.getpid()})"
        then = "wait for it to end (or stop it), or give this run another checkpoint_dir"
        with pytest.raises(UserInputError) as refused:
            await hierplan.run(ROOT_GOAL, checkpoint_dir=tmp_path, **common())
        assert str(refused.value) == busy(tmp_path, here, then)
        with pytest.raises(UserInputError) as refused:
            await hierplan.resume(tmp_path, Approve(), **common())
        assert str(refused.value) == busy(tmp_path, here, "wait for it to end (or stop it)")
        go_on.set()
    assert results[0].status == "succeeded", results[0].error
    assert free(tmp_path)


@pytest.mark.anyio
async def test_a_library_run_or_resume_is_refused_while_the_command_line_holds_the_directory(
    tmp_path: Path,
) -> None:
    calls: list[str] = []
    tools = [recording_tool(calls)]
    model = fanout_planner(2)
    paused = await hierplan.run(
        ROOT_GOAL, model=model, tools=tools, approver=PauseForReview(), checkpoint_dir=tmp_path
    )
    assert paused.status == "paused"
    saved = (tmp_path / CHECKPOINT_FILE).read_text()
    with held_elsewhere(tmp_path) as pid:
        other = f"another hierplan process (process {pid})"
        with pytest.raises(UserInputError) as refused:
            await hierplan.resume(tmp_path, Approve(by="alice"), model=model, tools=tools)
        assert str(refused.value) == busy(tmp_path, other, "wait for it to end (or stop it)")
        with pytest.raises(UserInputError) as refused:
            await hierplan.run(ROOT_GOAL, model=model, tools=tools, checkpoint_dir=tmp_path)
        then = "wait for it to end (or stop it), or give this run another checkpoint_dir"
        assert str(refused.value) == busy(tmp_path, other, then)
    # Neither touched the paused run: its checkpoint and pending plan are as they were.
    assert (tmp_path / CHECKPOINT_FILE).read_text() == saved
    assert (tmp_path / PENDING_DIR / "1.yaml").exists() and not (tmp_path / RESUMING_FILE).exists()
    assert calls == [] and model.calls == 1
    resumed = await hierplan.resume(tmp_path, Approve(by="alice"), model=model, tools=tools)
    assert resumed.status == "succeeded", resumed.error
    assert free(tmp_path)


@pytest.mark.anyio
async def test_the_lock_is_held_while_a_library_run_goes_and_let_go_of_when_it_pauses(
    tmp_path: Path,
) -> None:
    seen: list[str] = []
    result = await hierplan.run(
        ROOT_GOAL,
        approver=PauseForReview(),
        listeners=[lock_seen(tmp_path, seen)],
        checkpoint_dir=tmp_path,
        **common(),
    )
    assert result.status == "paused" and (tmp_path / CHECKPOINT_FILE).exists()
    assert seen and set(seen) == {str(os.getpid())}
    assert free(tmp_path)
    seen.clear()
    resumed = await hierplan.resume(
        tmp_path, Approve(), listeners=[lock_seen(tmp_path, seen)], **common()
    )
    assert resumed.status == "succeeded", resumed.error
    assert seen and set(seen) == {str(os.getpid())}
    assert free(tmp_path)


def failing_tool() -> Any:
    @hierplan.tool
    def record(text: str) -> str:
        """Record a text (and fail)."""
        raise RuntimeError("disk full")

    return record


@pytest.mark.anyio
async def test_the_lock_is_let_go_of_after_a_failed_run(tmp_path: Path) -> None:
    seen: list[str] = []
    result = await hierplan.run(
        ROOT_GOAL,
        model=fanout_planner(2),
        tools=[failing_tool()],
        listeners=[lock_seen(tmp_path, seen)],
        checkpoint_dir=tmp_path,
    )
    assert result.status in ("failed", "partial"), result.status
    assert seen and set(seen) == {str(os.getpid())}
    assert free(tmp_path)


@pytest.mark.anyio
async def test_the_lock_is_let_go_of_after_a_run_that_raised_or_was_cancelled(
    tmp_path: Path,
) -> None:
    def refused(request: ModelRequest) -> ModelResponse:
        assert (tmp_path / RUN_LOCK).read_text() == str(os.getpid())
        raise ModelAuthError("the key was refused")

    with pytest.raises(ModelAuthError):
        await hierplan.run(ROOT_GOAL, model=FunctionModel(refused), checkpoint_dir=tmp_path)
    assert free(tmp_path)

    waiting = anyio.Event()

    async def never(plan: Plan, ctx: GateContext) -> Approve:
        waiting.set()
        await anyio.sleep_forever()
        raise AssertionError("unreachable")

    async with anyio.create_task_group() as group:

        async def cancelled() -> None:
            await hierplan.run(
                ROOT_GOAL, approver=CallbackApprover(never), checkpoint_dir=tmp_path, **common()
            )

        group.start_soon(cancelled)
        await waiting.wait()
        assert not free(tmp_path)
        group.cancel_scope.cancel()
    assert free(tmp_path)


# -- the command line holds the lock and calls the library under it ------------------------


def taken_locks(monkeypatch: pytest.MonkeyPatch) -> list[Path]:
    """The directories a lock is taken on, in order (one held already is not taken again)."""
    from hierplan.durable import lock as dirlock

    taken: list[Path] = []
    real = dirlock.lock_directory

    def lock_directory(folder: Path, name: str, **kwargs: Any) -> dirlock.DirectoryLock:
        taken.append(folder)
        return real(folder, name, **kwargs)

    monkeypatch.setattr(dirlock, "lock_directory", lock_directory)
    return taken


def entered(monkeypatch: pytest.MonkeyPatch) -> list[Path]:
    """The directories :func:`hierplan.durable.lock.holding` is asked to hold, in order."""
    from hierplan.durable import lock as dirlock

    asked: list[Path] = []
    real = dirlock.holding

    def holding(folder: Path, name: str, **kwargs: Any) -> AbstractContextManager[None]:
        asked.append(folder)
        return real(folder, name, **kwargs)

    monkeypatch.setattr(dirlock, "holding", holding)
    return asked


def invoke(*args: str | Path) -> tuple[int, str]:
    result = CliRunner().invoke(app, [str(a) for a in args], env={"COLUMNS": "200"})
    return result.exit_code, result.output


FAST = ["--sim-latency-scale", "0", "--sim-profile", "ideal"]


def test_run_demo_and_resume_on_the_command_line_are_not_refused_by_their_own_run(
    tmp_path: Path, source_db: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    asked, taken = entered(monkeypatch), taken_locks(monkeypatch)
    run_dir = migration_dir(source_db, tmp_path / "mig")
    code, out = invoke(
        "run", "--scenario", "data_migration", "--pause-for-review", "-o", run_dir, *FAST
    )
    assert code == PAUSED, out
    # The command line took the lock; the run it called found it held, and kept it.
    assert asked == [run_dir, run_dir] and taken == [run_dir]
    assert free(run_dir) and (run_dir / "run.json").exists()
    asked.clear()
    taken.clear()
    code, out = invoke("resume", run_dir, "--approve")
    assert code == 0, out
    assert asked == [run_dir] * 3 and taken == [run_dir]  # the command, the resume, its run
    assert free(run_dir)
    asked.clear()
    taken.clear()
    demo = migration_dir(source_db, tmp_path / "demo")
    code, out = invoke("demo", "--out", demo, "--pause-for-review", *FAST)
    assert code == PAUSED, out
    assert asked == [demo, demo] and taken == [demo]
    assert free(demo) and (demo / CHECKPOINT_FILE).exists()


# -- batch goals with run directories of their own --------------------------------------------


def test_batch_goals_that_run_with_a_checkpoint_dir_lock_it_under_the_batch_lock(
    tmp_path: Path,
) -> None:
    goals = text_goals(tmp_path / "goals.jsonl", 4)
    out = tmp_path / "out"
    batch = config(goals, out, 1.0, 4, delay_s=0.2)
    run_stand_in = batch.run_fn
    seen: list[tuple[str, str, str]] = []

    async def in_a_directory(spec: hierplan.RunSpec, **kwargs: Any) -> Any:
        # Goals 1 and 2 share a directory, 3 and 4 have one each.
        goal_id = spec.run_id
        assert goal_id is not None
        run_dir = out / "goals" / {"line-2": "line-1"}.get(goal_id, goal_id)

        def watch(event: RunEvent) -> None:
            locks = (out / BATCH_LOCK).read_text(), (run_dir / RUN_LOCK).read_text()
            seen.append((goal_id, *locks))

        listeners = [*kwargs.pop("listeners", ()), watch]
        return await run_stand_in(spec, checkpoint_dir=run_dir, listeners=listeners, **kwargs)

    batch.run_fn = in_a_directory
    summary = anyio.run(run_batch, batch)
    rows = {r.id: r for r in Journal(out / "journal.sqlite").rows()}
    # The goal that found the shared directory locked failed at once (no wait, no deadlock);
    # the others ran, each holding its directory's lock inside the batch's.
    refused = [r for r in rows.values() if r.state == "failed"]
    assert len(refused) == 1 and refused[0].id in ("line-1", "line-2"), summary
    here = f"another run in this process (process {os.getpid()})"
    assert busy(out / "goals" / "line-1", here, "wait") in str(refused[0].reason)
    assert summary["counts"]["succeeded"] == 3
    pid = str(os.getpid())
    assert {who for who, _, _ in seen} == {f"line-{i}" for i in range(1, 5)} - {refused[0].id}
    assert {(b, r) for _, b, r in seen} == {(pid, pid)}
    assert not list(out.rglob("*.lock"))
