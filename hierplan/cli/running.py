"""How ``run``, ``demo`` and ``resume`` run: in a run directory they hold, on a handle that a
Ctrl-C or SIGTERM cancels, with the live console, and ending with the record saved and shown.

Exit status: 0 when the run succeeded (and its verification, if any, passed); 1 when it failed,
was partial or rejected; 2 for bad input; 3 when the run paused for a plan review; 130 when
interrupted (Ctrl-C), 143 when stopped by SIGTERM (both leave the run's record).
"""

from __future__ import annotations

import json
import shlex
import signal
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager, suppress
from pathlib import Path
from typing import NoReturn

import anyio
import typer
from anyio.abc import TaskStatus
from rich.console import Console

from hierplan.cli.options import fail
from hierplan.cli.review import EXIT_PAUSED, ReviewSetup, print_paused
from hierplan.core.instrument import Instrument
from hierplan.durable.checkpoint import CHECKPOINT_FILE, RESUMING_FILE
from hierplan.durable.lock import holding_run_directory
from hierplan.errors import HierplanError
from hierplan.files import new_directory
from hierplan.hierarchy.gate import Approver
from hierplan.records import RunResult
from hierplan.review.console import editor_open
from hierplan.runner.handle import RunHandle
from hierplan.runner.resume import drop_used_checkpoint
from hierplan.scenarios import scenarios
from hierplan.tracing.setup import configure_tracing, export_problems_in_one_line
from hierplan.view.console import RunConsole
from hierplan.view.tree import print_run

EXIT_INTERRUPTED = 130
EXIT_TERMINATED = 143  # 128 + SIGTERM, as a shell reports a process that SIGTERM ended
# Where a run without --out writes: a new directory named by the time it starts.
RUNS_DIR = Path("runs")
# The scenario the demo runs; a run.json of any other run is not the demo's to replace.
DEMO_SCENARIO = "data_migration"
# The signals that stop a run the way Ctrl-C does: a service manager or `kill` sends SIGTERM.
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)

Launcher = Callable[[RunConsole, Approver, list[Instrument]], RunHandle]
"""How a command starts its run: a handle, given the live console (a listener), the review's
approver and the tracing instruments."""


class StopSignal:
    """Which signal stopped a command's run, if one did: Ctrl-C (SIGINT) or SIGTERM."""

    __slots__ = ("signum",)

    def __init__(self) -> None:
        self.signum: int | None = None

    def exit_code(self) -> int:
        """130 after Ctrl-C, 143 after SIGTERM."""
        return EXIT_TERMINATED if self.signum == signal.SIGTERM else EXIT_INTERRUPTED

    def reason(self) -> str:
        """What stopped the run, in words: ``interrupted (Ctrl-C)`` or ``stopped by SIGTERM``."""
        return "stopped by SIGTERM" if self.signum == signal.SIGTERM else "interrupted (Ctrl-C)"


def _stop_requested(signum: int) -> bool:
    """Whether ``signum`` asks the run to stop: a Ctrl-C typed in the plan editor does not."""
    return signum != signal.SIGINT or not editor_open()


async def until_interrupted(handle: RunHandle, stop: StopSignal) -> RunResult:
    """The run of ``handle``, which the first Ctrl-C or SIGTERM cancels (unless it was a
    Ctrl-C typed in a plan editor): the run ends ``cancelled`` with its record, and ``stop``
    says which signal it was. A signal that comes before the run started (a resume still
    setting up) raises :class:`KeyboardInterrupt`: nothing ran. A second Ctrl-C stops at
    once."""

    async def cancel_on_signal(*, task_status: TaskStatus[None]) -> None:
        # Leaving the receiver gives SIGINT back to Python: the next one interrupts.
        with anyio.open_signal_receiver(*STOP_SIGNALS) as signals:
            task_status.started()
            async for signum in signals:
                if _stop_requested(signum):
                    stop.signum = signum
                    handle.cancel()
                    return

    failure: Exception | None = None
    async with anyio.create_task_group() as watch:
        # Listening before the run starts: a signal while it sets up (a scenario builds its
        # database for seconds) cancels it too, and it ends with a record like any other.
        await watch.start(cancel_on_signal)
        try:
            async with handle:
                result = await handle.result()
        except Exception as exc:  # re-raised as it is, not wrapped by the task group
            failure = exc
        watch.cancel_scope.cancel()
    if failure is not None:
        raise failure
    return result


def execute_command(
    console: Console,
    out: Path,
    setup: ReviewSetup,
    launch: Launcher,
    *,
    simulated: bool,
    trace: list[str] | None = None,
    trace_content: bool = False,
    resumed: bool = False,
) -> NoReturn:
    """Run what ``launch`` starts (with the live console, the review ``setup``'s approver and
    the ``--trace`` exporters), then save and show its record and exit with its status."""
    started = time.monotonic()
    stop = StopSignal()
    try:
        tracing = configure_tracing(trace, capture_content=trace_content or None)
    except HierplanError as exc:
        fail(str(exc))

    async def main() -> RunResult:
        display = RunConsole(console, simulated=simulated, show_root_plan=setup.mode != "console")
        try:
            instruments = [] if tracing is None else tracing.instruments
            handle = launch(display, setup.approver(console, display), instruments)
            result = await until_interrupted(handle, stop)
            if resumed and stop.signum is not None and not handle.started:
                raise KeyboardInterrupt  # nothing ran: the checkpoint is as it was
            return result
        finally:
            display.stop()

    try:
        with export_problems_in_one_line():
            try:
                result = anyio.run(main)
            finally:
                if tracing is not None:
                    tracing.shutdown()
    except HierplanError as exc:
        fail(str(exc))
    except KeyboardInterrupt:
        before = " before the resumed run started: nothing ran, it is still paused"
        fail(stop.reason() + (before if resumed else ""), stop.exit_code())
    finish(console, result, out, started, stop, resumed)


def exit_code(result: RunResult, stop: StopSignal) -> int:
    """The command's exit status for ``result`` (see the module docstring)."""
    if result.status == "cancelled":  # only a stop signal cancels a run started here
        return stop.exit_code()
    verified = result.verification is None or bool(result.verification.get("ok"))
    return 0 if result.status == "succeeded" and verified else 1


def finish(
    console: Console,
    result: RunResult,
    out: Path,
    started: float,
    stop: StopSignal,
    resumed: bool = False,
) -> NoReturn:
    """Save and show the run's record, and exit with its status. After a resume (``resumed``)
    the checkpoint it used is dropped once the record is saved, unless the run was cancelled:
    kept, it lets the user go on from the pause anyway."""
    # What hierplan resume says about a checkpoint left by a resume that did not finish.
    kept = (
        f"; the checkpoint it resumed from is kept ({RESUMING_FILE}): hierplan resume "
        f"{shlex.quote(str(out))} says how to go on"
        if resumed
        else ""
    )
    try:
        path: Path | None = result.write(out / "run.json")
    except (OSError, HierplanError) as exc:
        # The run is over whatever happens to its record: show it before saying so.
        path, unsaved = None, str(exc) if isinstance(exc, HierplanError) else exc.strerror
    console.print()
    print_run(result, console)
    _print_stats(console, result, started, resumed)
    if path is None:
        fail(f"the run record could not be written to {out / 'run.json'}: {unsaved}{kept}", 1)
    console.print(f"run record: {path}", highlight=False)
    if resumed and result.status != "cancelled":
        drop_used_checkpoint(out, result)
    if result.status == "paused":
        print_paused(console, result, out)
        raise typer.Exit(EXIT_PAUSED)
    if result.status == "cancelled" and stop.signum is not None:
        console.print(f"{stop.reason()}: the run was cancelled{kept}", highlight=False)
    raise typer.Exit(exit_code(result, stop))


def _print_stats(console: Console, result: RunResult, started: float, resumed: bool) -> None:
    # After a resume, the time of this command only: run.json and the HTML report count the
    # whole run, from its first start (the pause included).
    stats = [
        f"wall time{' of this resume' if resumed else ''} {time.monotonic() - started:.1f} s",
        f"peak leaves running at once {result.stats.get('peak_concurrent_leaves', 0)}",
    ]
    details = (result.verification or {}).get("details", {})
    if "rows_per_second" in details:
        stats.append(f"rows migrated per second {details['rows_per_second']:,}")
    console.print("  ".join(stats), style="dim", highlight=False)


# -- the run directory ---------------------------------------------------------------------
@contextmanager
def holding(run_dir: Path, *, otherwise: str) -> Iterator[None]:
    """Hold ``run_dir``'s lock (:mod:`hierplan.durable.lock`) for the body, or refuse: two
    processes writing one run directory would mix their records, checkpoints and scenario
    files. ``otherwise`` says what the refused command can do instead of waiting. The run the
    body starts there sees that it is held (and does not refuse itself); the body goes on
    writing the directory (run.json) after the run returns, with the lock still held."""
    with ExitStack() as held:
        try:
            held.enter_context(holding_run_directory(run_dir, otherwise=otherwise))
        except HierplanError as exc:
            fail(str(exc))
        yield


def refuse_paused_run(run_dir: Path, *, start_over: str = "") -> None:
    """Refuse a new run in a directory that holds a paused one: the new run would drop the
    paused run's checkpoint and the decisions waiting in its pending/ folder. ``start_over``
    ends the way to start over there (e.g. the flag that lets the new run replace the old)."""
    if not (run_dir / CHECKPOINT_FILE).exists():
        return
    where = shlex.quote(str(run_dir))
    fail(
        f"{run_dir} holds a paused run waiting for a decision: continue it with hierplan resume "
        f"{where} (its pending/ folder says how), or give this run another --out; to start over "
        f"in {run_dir}, delete {run_dir / CHECKPOINT_FILE} first{start_over}"
    )


def refuse_earlier_run(run_dir: Path, scenario: str | None) -> None:
    """Refuse a run in a directory that holds an earlier run's record, or files its scenario's
    setup would delete: they would be lost without a word."""
    earlier = [run_dir / "run.json"] if (run_dir / "run.json").is_file() else []
    found = scenarios().get(scenario) if scenario is not None else None
    if found is not None:  # an unknown one is refused by the run, saying which are known
        earlier += found.replaced_files(run_dir)
    if earlier:
        names = ", ".join(path.name for path in earlier)
        fail(
            f"{run_dir} holds an earlier run ({names}) that this run would replace: give "
            "--overwrite to replace it, or give this run another --out"
        )


def refuse_other_record(run_dir: Path) -> None:
    """Refuse a demo in a directory whose ``run.json`` is not a data-migration run's record
    (a ``hierplan run`` of another goal, or no record at all): the demo replaces only its
    own kind of output."""
    path = run_dir / "run.json"
    if not path.is_file():
        return
    try:
        record = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, ValueError):
        record = None
    if isinstance(record, dict) and record.get("scenario") == DEMO_SCENARIO:
        return
    fail(
        f"{path} is not the record of a demo (or another data-migration run), and the demo "
        "would replace it: give the demo another --out, or move that file away"
    )


def new_run_directory() -> list[Path]:
    """Make ``runs/<time>`` for a run without --out; the directories made, innermost first."""
    made = [] if RUNS_DIR.exists() else [RUNS_DIR]
    made.insert(0, new_directory(RUNS_DIR, time.strftime("%Y%m%d-%H%M%S"), "the run"))
    return made


@contextmanager
def removed_if_empty(directories: list[Path]) -> Iterator[None]:
    """Remove each of ``directories`` (innermost first) on the way out if it is empty."""
    try:
        yield
    finally:
        for directory in directories:
            with suppress(OSError):  # not empty (the run wrote its record), or gone
                directory.rmdir()
