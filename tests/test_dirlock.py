"""The directory lock that ``run``, ``demo``, ``resume`` and ``batch`` hold on their directory."""

from __future__ import annotations

import contextvars
import os
import signal
import subprocess
import sys
import threading
from contextlib import AbstractContextManager
from pathlib import Path

import anyio
import pytest
from typer.testing import CliRunner

from hierplan.cli import app
from hierplan.durable import lock as dirlock
from hierplan.durable.lock import RUN_LOCK, lock_directory
from hierplan.errors import UserInputError

HOLD = """
import sys
from pathlib import Path
from hierplan.durable.lock import RUN_LOCK, lock_directory
lock_directory(Path(sys.argv[1]), "run.lock", what="the run directory", wait="wait")
print("held", flush=True)
sys.stdin.read()
"""


def take(folder: Path) -> dirlock.DirectoryLock:
    return lock_directory(folder, RUN_LOCK, what="the run directory", wait="wait for it")


def test_a_second_process_is_refused_until_the_first_dies(tmp_path: Path) -> None:
    with subprocess.Popen(
        [sys.executable, "-c", HOLD, str(tmp_path)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    ) as holder:
        try:
            assert holder.stdout is not None and holder.stdout.readline() == "held\n"
            message = (
                f"{tmp_path} is in use by another hierplan process (process {holder.pid}), "
                "which holds its lock run.lock: wait for it"
            )
            with pytest.raises(UserInputError) as refused:
                take(tmp_path)
            assert str(refused.value) == message
        finally:
            holder.send_signal(signal.SIGKILL)  # no clean-up runs: the kernel lets go of it
            holder.wait()
    assert (tmp_path / RUN_LOCK).exists()  # what the killed process left locks nothing
    lock = take(tmp_path)
    assert (tmp_path / RUN_LOCK).read_text() == str(os.getpid())
    lock.release()
    lock.release()
    assert not (tmp_path / RUN_LOCK).exists()


def test_a_lock_file_replaced_while_it_was_taken_is_taken_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    opened: list[int] = []
    real_open = os.open

    def open_then_holder_lets_go(path: str | Path, flags: int, mode: int = 0o777) -> int:
        fd = real_open(path, flags, mode)
        if not opened:
            # The holder deletes the file as it lets go, and a third process makes a new one:
            # locking the old one would lock nothing anyone else sees.
            os.unlink(path)
            os.close(real_open(path, os.O_RDWR | os.O_CREAT, 0o644))
        opened.append(fd)
        return fd

    monkeypatch.setattr(os, "open", open_then_holder_lets_go)
    lock = take(tmp_path)
    assert len(opened) == 2 and lock.fd == opened[1]
    assert os.fstat(opened[1]).st_ino == (tmp_path / RUN_LOCK).stat().st_ino
    lock.release()


def test_a_refused_run_leaves_no_directory_behind(tmp_path: Path) -> None:
    out = tmp_path / "runs" / "new"
    result = CliRunner().invoke(app, ["run", "say hi", "-o", str(out), "--model", "bogus:x", "-y"])
    assert result.exit_code == 2 and "unknown model 'bogus:x'" in result.output
    assert not (tmp_path / "runs").exists()
    kept = tmp_path / "kept"
    kept.mkdir()
    (kept / "notes.txt").write_text("mine")
    result = CliRunner().invoke(app, ["resume", str(kept), "--approve"])
    assert result.exit_code == 2 and "not a paused run directory" in result.output
    assert sorted(p.name for p in kept.iterdir()) == ["notes.txt"]


def test_a_directory_that_cannot_be_locked_says_why(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("")
    with pytest.raises(UserInputError, match="is a file, not a directory"):
        take(tmp_path / "file" / "run")


def hold(folder: Path) -> AbstractContextManager[None]:
    return dirlock.holding(folder, RUN_LOCK, what="the run directory", wait="wait for it")


def test_holding_is_re_entered_in_its_own_flow_only(tmp_path: Path) -> None:
    async def in_an_event_loop() -> None:
        with hold(tmp_path):  # the flow's lock reaches the loop anyio.run starts
            pass

    refused: list[BaseException] = []

    def elsewhere() -> None:
        try:
            with hold(tmp_path):
                pass
        except UserInputError as exc:
            refused.append(exc)

    with hold(tmp_path):
        with hold(tmp_path):
            pass
        assert (tmp_path / RUN_LOCK).read_text() == str(os.getpid())  # still held
        anyio.run(in_an_event_loop)
        assert (tmp_path / RUN_LOCK).exists()
        # A thread does not start in this flow: it is refused, as another process would be.
        thread = threading.Thread(target=elsewhere)
        thread.start()
        thread.join()
        assert [str(e) for e in refused] == [
            f"{tmp_path} is in use by another run in this process (process {os.getpid()}), "
            "which holds its lock run.lock: wait for it"
        ]
        later = contextvars.copy_context()
    assert not (tmp_path / RUN_LOCK).exists()
    # A flow that outlives the holding (a task started under it, still running) takes the
    # lock again rather than count on one that was let go of.
    again = hold(tmp_path)
    later.run(again.__enter__)
    assert (tmp_path / RUN_LOCK).exists()
    with pytest.raises(UserInputError, match="another run in this process"):
        take(tmp_path)
    later.run(again.__exit__, None, None, None)
    assert not (tmp_path / RUN_LOCK).exists()


HOLD_NAMED = """
import sys
from pathlib import Path
from hierplan.durable.lock import lock_directory
lock_directory(Path(sys.argv[1]), sys.argv[2], what="the directory", wait="wait")
print("held", flush=True)
sys.stdin.read()
"""


@pytest.mark.parametrize(
    ("held", "command", "kind"),
    [
        ("run.lock", ["batch", "{goals}", "--out", "{dir}"], "a run"),
        ("batch.lock", ["run", "--scenario", "data_migration", "-y", "--out", "{dir}"], "a batch"),
        ("batch.lock", ["demo", "--out", "{dir}"], "a batch"),
    ],
)
def test_a_run_and_a_batch_refuse_a_directory_the_other_holds(
    tmp_path: Path, held: str, command: list[str], kind: str
) -> None:
    folder = tmp_path / "shared"
    goals = tmp_path / "goals.jsonl"
    goals.write_text('{"suite": "game24", "task": 0}\n')
    args = [a.format(goals=goals, dir=folder) for a in command]
    with subprocess.Popen(
        [sys.executable, "-c", HOLD_NAMED, str(folder), held],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    ) as holder:
        try:
            assert holder.stdout is not None and holder.stdout.readline() == "held\n"
            before = sorted(p.name for p in folder.iterdir())
            result = CliRunner().invoke(app, [*args, "--sim-latency-scale", "0"])
            text = " ".join(result.output.split())
            assert result.exit_code == 2, result.output
            assert text.startswith(
                f"error: {folder} is in use by another hierplan process (process {holder.pid}), "
                f"which holds its lock {held} ({kind} writes there): wait for it to end"
            ), text
            assert sorted(p.name for p in folder.iterdir()) == before  # nothing written
        finally:
            holder.send_signal(signal.SIGKILL)
            holder.wait()
    # Once the holder is gone (its lock file left behind), the directory is free again.
    result = CliRunner().invoke(app, [*args, "--sim-latency-scale", "0"])
    assert "is in use" not in result.output


def test_the_other_lock_is_looked_at_in_this_process_too(tmp_path: Path) -> None:
    lock = take(tmp_path)
    try:
        with pytest.raises(UserInputError, match=r"holds its lock run.lock \(a run writes there\)"):
            lock_directory(tmp_path, "batch.lock", what="the batch directory", wait="wait")
        assert not (tmp_path / "batch.lock").exists()  # the refused lock let go of its file
    finally:
        lock.release()
    batch = lock_directory(tmp_path, "batch.lock", what="the batch directory", wait="wait")
    batch.release()
