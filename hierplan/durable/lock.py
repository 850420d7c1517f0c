"""An exclusive lock on a directory that one hierplan process writes at a time.

``hierplan run -o DIR``, ``demo``, ``resume DIR`` and ``batch --out DIR`` each hold their
directory's lock for as long as they run (``run.lock``, or ``batch.lock`` for a batch; each
refuses a directory whose other lock is held, so a run and a batch never write one at once),
and so do :func:`hierplan.run` with a ``checkpoint_dir`` and :func:`hierplan.resume`: two
writers of one directory would interleave or overwrite its records (and a batch would spend
what is left of its budget twice). The lock is ``flock`` on a file in the directory: taken
without waiting (the second process is refused at once), and released by the kernel when the
process ends however it ends, a ``SIGKILL`` included. A lock file a killed process leaves
behind locks nothing.

The holder deletes its lock file as it lets go, so that a finished run leaves its directory as
it was; a process that opened the file just before it went checks, once it holds the lock, that
the file it locked is still the one at that path, and opens the new one if not.

:func:`holding` is re-entrant within one flow of control: the command line holds a run
directory's lock while it calls :func:`hierplan.run` on that directory (and goes on writing
there after it returns), and a run that takes the lock itself sees that its caller holds it.
What a flow holds is a :class:`~contextvars.ContextVar`, so it reaches the event loop
``anyio.run`` starts and the tasks started from the holder, but not a task or thread that was
not: another run in the same process on that directory is refused, as another process is.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping
from contextlib import AbstractContextManager, contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType

from hierplan.errors import UserInputError
from hierplan.files import StrPath, make_directory

try:
    import fcntl
except ImportError as exc:  # pragma: no cover - Windows, which hierplan does not run on
    # Running without the lock would let two processes write one directory unseen.
    raise ImportError(
        "hierplan needs a POSIX system (Linux, macOS): it locks its run and batch directories "
        "with fcntl.flock"
    ) from exc


RUN_LOCK = "run.lock"
"""Held in a run directory by the one process running or resuming the run there."""
BATCH_LOCK = "batch.lock"
"""Held in a batch directory by the one process running the batch there."""
# A run and a batch write files of the same names (run.json, goals/...) and neither expects the
# other's: each refuses a directory the other holds, as it refuses one its own kind holds.
_EXCLUDES: Mapping[str, tuple[str, str]] = MappingProxyType(
    {RUN_LOCK: (BATCH_LOCK, "a batch"), BATCH_LOCK: (RUN_LOCK, "a run")}
)


@dataclass(slots=True)
class DirectoryLock:
    """The lock this process holds on a directory: :meth:`release` it when done."""

    path: Path
    """The lock file."""
    fd: int | None
    created: list[Path] = field(default_factory=list)
    """Directories that taking the lock created, deepest first (removed again if left empty)."""

    def release(self) -> None:
        """Delete the lock file, give up the lock, and remove the directories taking it
        created if nothing else was written there. Releasing twice does nothing."""
        if self.fd is None:
            return
        self.path.unlink(missing_ok=True)  # while still held: see the module docstring
        os.close(self.fd)
        self.fd = None
        for folder in self.created:
            try:
                folder.rmdir()
            except OSError:  # something was written there (or it is gone): keep it
                break


def lock_directory(folder: Path, name: str, *, what: str, wait: str) -> DirectoryLock:
    """Take the lock ``folder/name`` for this process, creating ``folder`` if needed, or raise
    :class:`UserInputError` if another process holds it. ``what`` names the directory in
    messages (e.g. "the run directory"); ``wait`` says what to wait for before trying again."""
    created = [p for p in (folder, *folder.parents) if not p.exists()]
    make_directory(folder, what)
    path = folder / name
    while True:
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as exc:
            raise UserInputError(f"cannot lock {what} {folder}: {exc.strerror or exc}") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            holder = _holder(fd)
            raise UserInputError(
                f"{folder} is in use by {holder}, which holds its lock {name}: {wait}"
            ) from None
        if _same_file(fd, path):
            break
        os.close(fd)  # its holder deleted it as it let go: lock the file there now
    os.ftruncate(fd, 0)
    os.write(fd, str(os.getpid()).encode())
    lock = DirectoryLock(path, fd, created)
    if name in _EXCLUDES:
        # Checked while holding its own lock: of a run and a batch starting at once, the one
        # that looks second sees the other's lock (both may be refused, never both let in).
        other, kind = _EXCLUDES[name]
        other_holder = _probe(folder / other)
        if other_holder is not None:
            lock.release()
            raise UserInputError(
                f"{folder} is in use by {other_holder}, which holds its lock {other} ({kind} "
                f"writes there): {wait}"
            )
    return lock


def _holder(fd: int) -> str:
    """Who holds the lock open as ``fd`` (which this closes), by the id it wrote there."""
    holder = os.read(fd, 32).decode(errors="replace").strip()
    os.close(fd)
    if holder == str(os.getpid()):
        return f"another run in this process (process {holder})"
    return "another hierplan process" + (f" (process {holder})" if holder else "")


def _probe(path: Path) -> str | None:
    """Who holds the lock file ``path`` now, or ``None`` if no one does (or there is none)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:  # no such lock: no one holds it
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except OSError:
        return _holder(fd)
    os.close(fd)  # closing lets go of the shared lock taken to look
    return None


def _same_file(fd: int, path: Path) -> bool:
    try:
        there = path.stat()
    except FileNotFoundError:
        return False
    mine = os.fstat(fd)
    return (there.st_dev, there.st_ino) == (mine.st_dev, mine.st_ino)


_held: ContextVar[tuple[tuple[Path, DirectoryLock], ...]] = ContextVar("hierplan_held_locks")
"""The locks this flow of control holds through :func:`holding`, by resolved lock file path."""


@contextmanager
def holding(folder: Path, name: str, *, what: str, wait: str) -> Iterator[None]:
    """Hold the lock ``folder/name`` for the body (see :func:`lock_directory`), and let go of
    it on any exit, an exception or a cancellation included. Within a body that holds it
    already (an outer :func:`holding` of this flow), this holds nothing more and lets go of
    nothing: the outer one still holds it."""
    key = folder.resolve() / name
    held = _held.get(())
    if any(path == key and lock.fd is not None for path, lock in held):
        yield
        return
    lock = lock_directory(folder, name, what=what, wait=wait)
    token = _held.set((*held, (key, lock)))
    try:
        yield
    finally:
        _held.reset(token)
        lock.release()


def holding_run_directory(run_dir: StrPath, *, otherwise: str = "") -> AbstractContextManager[None]:
    """:func:`holding` on ``run_dir``'s :data:`RUN_LOCK` (a ``str`` or a ``Path``);
    ``otherwise`` ends the refusal's message, saying what to do instead of waiting (e.g.
    ``", or give this run another --out"``).
    """
    return holding(
        Path(run_dir),
        RUN_LOCK,
        what="the run directory",
        wait=f"wait for it to end (or stop it){otherwise}",
    )
