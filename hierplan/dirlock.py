"""An exclusive lock on a directory that one hierplan process writes at a time.

``hierplan run -o DIR``, ``demo``, ``resume DIR`` and ``batch --out DIR`` each hold their
directory's lock for as long as they run: two processes writing one directory would interleave
or overwrite its records (and a batch would spend what is left of its budget twice). The lock
is ``flock`` on a file in the directory: taken without waiting (the second process is refused
at once), and released by the kernel when the process ends however it ends, a ``SIGKILL``
included. A lock file a killed process leaves behind locks nothing.

The holder deletes its lock file as it lets go, so that a finished run leaves its directory as
it was; a process that opened the file just before it went checks, once it holds the lock, that
the file it locked is still the one at that path, and opens the new one if not.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from hierplan.errors import UserInputError
from hierplan.hierarchy.record import make_directory

try:
    import fcntl
except ImportError as exc:  # pragma: no cover - Windows, which hierplan does not run on
    # Running without the lock would let two processes write one directory unseen.
    raise ImportError(
        "hierplan needs a POSIX system (Linux, macOS): it locks its run and batch directories "
        "with fcntl.flock"
    ) from exc


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
            holder = os.read(fd, 32).decode(errors="replace").strip()
            os.close(fd)
            pid = f" (process {holder})" if holder else ""
            raise UserInputError(
                f"{folder} is in use by another hierplan process{pid}, which holds its lock "
                f"{name}: {wait}"
            ) from None
        if _same_file(fd, path):
            break
        os.close(fd)  # its holder deleted it as it let go: lock the file there now
    os.ftruncate(fd, 0)
    os.write(fd, str(os.getpid()).encode())
    return DirectoryLock(path, fd, created)


def _same_file(fd: int, path: Path) -> bool:
    try:
        there = path.stat()
    except FileNotFoundError:
        return False
    mine = os.fstat(fd)
    return (there.st_dev, there.st_ino) == (mine.st_dev, mine.st_ino)
