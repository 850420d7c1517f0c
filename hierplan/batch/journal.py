"""The batch journal: one SQLite database (WAL mode) in the batch's directory.

It holds what a crash must not lose: the batch's settings and budget, and for each goal its
state, its attempts, what its current attempt holds and has spent (written before each model
call is made and after it is settled), what earlier attempts spent, and its run record. Every
change is one transaction, so a reader, or a resume after ``SIGKILL``, sees each change whole
or not at all. ``synchronous=NORMAL`` in WAL mode keeps every committed transaction through a
crash of the process (an operating-system crash may lose the last ones, never corrupt them).

Goal states: ``pending`` → ``running`` → ``succeeded`` | ``failed`` | ``skipped`` (not started:
the budget left could not cover the goal's minimum). A resumed batch puts ``running`` goals back
to ``pending``; what their attempt had spent, and every call it still held (it may have been
billed), stays spent as ``prior``.
"""

from __future__ import annotations

import json
import sqlite3
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any

from hierplan.batch.goals import BatchGoal
from hierplan.durable.lock import BATCH_LOCK, DirectoryLock, lock_directory
from hierplan.errors import UserInputError
from hierplan.redact import redact

JOURNAL = "journal.sqlite"
LOCK = BATCH_LOCK
"""Held (:mod:`hierplan.durable.lock`) by the one process that runs the batch; it holds that
process's id."""
FINAL_STATES = ("succeeded", "failed", "skipped")
STATES = ("pending", "running", *FINAL_STATES)
META_KEYS = ("goals_path", "goals_digest", "backend", "namespace", "budget", "options")
"""The settings every batch's journal holds."""
_BUDGET_KEYS = ("tokens", "pico", "concurrency", "goal_tokens", "goal_pico")
LARGEST_AMOUNT = 2**63 - 1
"""The largest amount the journal counts: SQLite's integers are 64-bit (in pico-dollars, about
$9.2 million)."""
# A goal's counts and amounts, in the order a damaged one is reported.
_AMOUNTS = (
    "attempts",
    "spent_tokens",
    "spent_pico",
    "held_tokens",
    "held_pico",
    "prior_tokens",
    "prior_pico",
)
# The unit each checked figure counts in, named in the message about a bad one (read-only:
# shared by every journal).
_UNITS = MappingProxyType({"attempts": "attempts", "tokens": "tokens", "pico": "pico-dollars"})


def _unit(name: str) -> str:
    return _UNITS[name.rsplit("_", 1)[-1]]


@dataclass(slots=True)
class _Spend:
    """The batch's spend as :meth:`Journal.spent` adds it up (every goal's spent, held and
    prior), in Python's integers, with the largest amount of each unit and where it is."""

    totals: dict[str, int] = field(default_factory=lambda: {"tokens": 0, "pico": 0})
    largest: dict[str, tuple[int, str]] = field(default_factory=dict)

    def add(self, where: str, name: str, value: int) -> None:
        dimension = name.rsplit("_", 1)[-1]
        if dimension not in self.totals:
            return  # attempts: counted, not spent
        self.totals[dimension] += value
        if value >= self.largest.get(dimension, (-1, ""))[0]:
            self.largest[dimension] = (value, f"{where} has {name} {value:,}")

    def beyond_count(self) -> str | None:
        """What is wrong if the spend passes what SQLite's integers count (the sums would
        fail), naming the largest amount of that unit, the likeliest damage."""
        for dimension, total in self.totals.items():
            if total > LARGEST_AMOUNT:
                return (
                    f"{self.largest[dimension][1]}, which takes the batch's spend past the "
                    f"{LARGEST_AMOUNT:,} {_UNITS[dimension]} the journal can count"
                )
        return None


# -- credentials are not journaled ----------------------------------------------------------
#
# The journal keeps the settings of a batch for as long as its directory lives, and a
# --base-url can carry a password or a key.

WITHHELD = "withheld"
"""The setting that lists the flags whose values the journal keeps without their credentials
(a resume must give them again)."""


def url_as_journaled(url: str | None) -> str | None:
    """``url`` as the journal keeps it: without user info or secret-looking parameters."""
    return None if url is None else redact(url)


def _journaled_settings(meta: dict[str, Any]) -> dict[str, Any]:
    """The batch's settings as the journal keeps them: ``--base-url`` without credentials,
    and, when that took any away, the flag named in :data:`WITHHELD`."""
    options = meta.get("options")
    if not isinstance(options, dict) or options.get("base_url") is None:
        return meta
    kept = url_as_journaled(options["base_url"])
    if kept == options["base_url"]:
        return meta
    return {**meta, "options": {**options, "base_url": kept}, WITHHELD: ["--base-url"]}


def damaged_journal(path: Path, problem: str) -> UserInputError:
    """The error for a batch journal that cannot be trusted: which file, what is wrong, and
    what to do (the batch cannot go on from it; its goals' records stay where they are)."""
    return UserInputError(
        f"the batch journal {path} is damaged ({problem}): the batch cannot be resumed from it; "
        f"run the goals file again with another --out (run records already written stay in "
        f"{path.parent / 'goals'})"
    )


_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS goals (
    id TEXT PRIMARY KEY,
    position INTEGER NOT NULL,
    goal TEXT NOT NULL,
    state TEXT NOT NULL DEFAULT 'pending',
    status TEXT,
    reason TEXT,
    attempts INTEGER NOT NULL DEFAULT 0,
    grant_tokens INTEGER,
    grant_pico INTEGER,
    held_tokens INTEGER NOT NULL DEFAULT 0,
    held_pico INTEGER NOT NULL DEFAULT 0,
    spent_tokens INTEGER NOT NULL DEFAULT 0,
    spent_pico INTEGER NOT NULL DEFAULT 0,
    prior_tokens INTEGER NOT NULL DEFAULT 0,
    prior_pico INTEGER NOT NULL DEFAULT 0,
    account TEXT,
    started_at REAL,
    finished_at REAL,
    record TEXT
);
"""


@dataclass(slots=True)
class GoalRow:
    """A goal's row of the journal."""

    id: str
    position: int
    goal: BatchGoal
    state: str
    status: str | None
    reason: str | None
    attempts: int
    spent_tokens: int
    spent_pico: int
    prior_tokens: int
    prior_pico: int
    account: str | None
    started_at: float | None
    finished_at: float | None
    record: str | None

    @property
    def total_tokens(self) -> int:
        """What every attempt of the goal spent, in tokens."""
        return self.spent_tokens + self.prior_tokens

    @property
    def total_pico(self) -> int:
        """What every attempt of the goal spent, in pico-dollars."""
        return self.spent_pico + self.prior_pico


class Journal:
    """The journal of one batch directory. Use it from one thread (the batch's event loop)."""

    def __init__(
        self, path: Path, lock: DirectoryLock | None = None, *, create: bool = True
    ) -> None:
        self.path = path
        self._lock = lock
        self.db = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        self.db.execute("PRAGMA busy_timeout=5000")
        if create:  # a journal being resumed is read as it is: nothing is added to a damaged one
            self.db.execute("PRAGMA journal_mode=WAL")
            self.db.executescript(_SCHEMA)
        self.db.execute("PRAGMA synchronous=NORMAL")

    @classmethod
    def exists(cls, out: Path) -> bool:
        """Whether ``out`` holds a journal."""
        return (out / JOURNAL).exists()

    def close(self) -> None:
        """Close the database (every transaction is already committed) and give up the
        batch directory's lock."""
        self.db.close()
        if self._lock is not None:
            self._lock.release()
            self._lock = None

    @contextmanager
    def transaction(self) -> Iterator[sqlite3.Connection]:
        """One atomic change: committed whole, or rolled back whole."""
        self.db.execute("BEGIN IMMEDIATE")
        try:
            yield self.db
        except BaseException:
            self.db.execute("ROLLBACK")
            raise
        self.db.execute("COMMIT")

    def check(self) -> None:
        """Refuse a damaged journal (:class:`UserInputError` naming the file and what is wrong
        in it) before a resume trusts it: a journal missing its goals would read as a batch
        with nothing left to do. SQLite itself drops a transaction a crash cut short (the
        journal's contract: each change whole or not at all), so whatever is wrong here is
        damage, not a torn last write."""
        try:
            problems = [str(r[0]) for r in self.db.execute("PRAGMA quick_check(3)")]
            if problems != ["ok"]:
                raise damaged_journal(self.path, "; ".join(problems))
            self._check_meta()
            self._check_goals()
        except sqlite3.DatabaseError as exc:
            raise damaged_journal(self.path, str(exc)) from None

    def _check_meta(self) -> None:
        meta: dict[str, Any] = {}
        for key, value in self.db.execute("SELECT key, value FROM meta"):
            try:
                meta[key] = json.loads(value)
            except (TypeError, ValueError):
                raise damaged_journal(self.path, f"its setting {key!r} is not JSON") from None
        missing = [key for key in META_KEYS if key not in meta]
        if missing:
            raise damaged_journal(self.path, f"it lacks the batch's {', '.join(missing)}")
        budget = meta["budget"]
        if not isinstance(budget, dict) or set(budget) != set(_BUDGET_KEYS):
            raise damaged_journal(self.path, "its budget is not one a batch writes")
        for key, value in budget.items():
            least = 1 if key == "concurrency" else 0
            unlimited = value is None and key != "concurrency"
            if not unlimited and not (type(value) is int and least <= value <= LARGEST_AMOUNT):
                raise damaged_journal(self.path, f"its budget's {key} {value!r} is not a batch's")
        if not isinstance(meta["options"], dict):
            raise damaged_journal(self.path, "its options are not one a batch writes")

    def _check_goals(self) -> None:
        cursor = self.db.execute(
            f"SELECT position, id, goal, state, {', '.join(_AMOUNTS)} FROM goals ORDER BY position"
        )
        count = 0
        spend = _Spend()
        for count, (position, goal_id, goal, state, *amounts) in enumerate(cursor, 1):
            where = f"goal row {count} ({goal_id!r})"
            if position != count - 1:
                raise damaged_journal(self.path, f"{where} is out of place (rows are missing)")
            try:
                BatchGoal.from_json(goal)
            except (TypeError, ValueError, KeyError):
                raise damaged_journal(self.path, f"{where} holds no goal a batch writes") from None
            if state not in STATES:
                raise damaged_journal(self.path, f"{where} is in no known state ({state!r})")
            for name, value in zip(_AMOUNTS, amounts, strict=True):
                if type(value) is not int or value < 0:
                    raise damaged_journal(
                        self.path,
                        f"{where} has {name} {value!r}, not a whole number of {_unit(name)} >= 0",
                    )
                spend.add(where, name, value)
        if count == 0:
            raise damaged_journal(self.path, "it holds no goals")
        if problem := spend.beyond_count():
            raise damaged_journal(self.path, problem)

    # -- the batch -----------------------------------------------------------------------

    def create(self, meta: dict[str, Any], goals: Sequence[BatchGoal]) -> None:
        """Write a new batch: its settings (without the credentials of a URL, see
        :func:`url_as_journaled`) and every goal, pending."""
        with self.transaction() as db:
            db.executemany(
                "INSERT INTO meta (key, value) VALUES (?, ?)",
                [(k, json.dumps(v)) for k, v in _journaled_settings(meta).items()],
            )
            db.executemany(
                "INSERT INTO goals (id, position, goal) VALUES (?, ?, ?)",
                [(g.id, i, g.to_json()) for i, g in enumerate(goals)],
            )

    def meta(self) -> dict[str, Any]:
        """The batch's settings."""
        return {k: json.loads(v) for k, v in self.db.execute("SELECT key, value FROM meta")}

    def set_meta(self, key: str, value: Any) -> None:
        """Set one setting of the batch."""
        with self.transaction() as db:
            db.execute(
                "INSERT INTO meta (key, value) VALUES (?, ?) "
                "ON CONFLICT(key) DO UPDATE SET value = excluded.value",
                (key, json.dumps(value)),
            )

    def rows(self) -> list[GoalRow]:
        """Every goal's row, in file order."""
        cursor = self.db.execute(
            "SELECT id, position, goal, state, status, reason, attempts, spent_tokens, "
            "spent_pico, prior_tokens, prior_pico, account, started_at, finished_at, record "
            "FROM goals ORDER BY position"
        )
        return [GoalRow(r[0], r[1], BatchGoal.from_json(r[2]), *r[3:]) for r in cursor.fetchall()]

    def row(self, goal_id: str) -> GoalRow:
        """One goal's row."""
        for row in self.rows():
            if row.id == goal_id:
                return row
        raise KeyError(goal_id)

    def recover(self) -> list[str]:
        """After a crash: goals that were running go back to pending; what their attempt spent
        and still held stays spent (as ``prior``). Returns their ids."""
        with self.transaction() as db:
            ids = [r[0] for r in db.execute("SELECT id FROM goals WHERE state = 'running'")]
            db.execute(
                "UPDATE goals SET state = 'pending', "
                "prior_tokens = prior_tokens + spent_tokens + held_tokens, "
                "prior_pico = prior_pico + spent_pico + held_pico, "
                "spent_tokens = 0, spent_pico = 0, held_tokens = 0, held_pico = 0, "
                "grant_tokens = NULL, grant_pico = NULL, account = NULL "
                "WHERE state = 'running'"
            )
        return ids

    def spent(self) -> tuple[int, int]:
        """Tokens and pico-dollars the batch has spent (every attempt of every goal, and what
        running attempts hold now)."""
        row = self.db.execute(
            "SELECT COALESCE(SUM(spent_tokens + held_tokens + prior_tokens), 0), "
            "COALESCE(SUM(spent_pico + held_pico + prior_pico), 0) FROM goals"
        ).fetchone()
        return int(row[0]), int(row[1])

    def counts(self) -> dict[str, int]:
        """How many goals are in each state."""
        counts = dict.fromkeys(("pending", "running", *FINAL_STATES), 0)
        for state, n in self.db.execute("SELECT state, COUNT(*) FROM goals GROUP BY state"):
            counts[state] = n
        return counts

    # -- one goal ------------------------------------------------------------------------

    def start(
        self, goal_id: str, grant: tuple[int | None, int | None], account: str | None = None
    ) -> None:
        """The goal starts an attempt with ``grant`` from the batch's budget."""
        with self.transaction() as db:
            db.execute(
                "UPDATE goals SET state = 'running', attempts = attempts + 1, grant_tokens = ?, "
                "grant_pico = ?, held_tokens = 0, held_pico = 0, spent_tokens = 0, "
                "spent_pico = 0, account = ?, started_at = ? WHERE id = ?",
                (grant[0], grant[1], account, time.time(), goal_id),
            )

    def count_attempts(self, goal_id: str, attempts: int) -> None:
        """The goal has been attempted ``attempts`` times (counted where it ran: a Celery goal
        delivered again after its worker died); the count never goes down."""
        with self.transaction() as db:
            db.execute(
                "UPDATE goals SET attempts = MAX(attempts, ?) WHERE id = ?", (attempts, goal_id)
            )

    def progress(self, goal_id: str, held: tuple[int, int], spent: tuple[int, int]) -> None:
        """What the goal's running attempt holds for calls in flight, and has spent."""
        with self.transaction() as db:
            db.execute(
                "UPDATE goals SET held_tokens = ?, held_pico = ?, spent_tokens = ?, "
                "spent_pico = ? WHERE id = ?",
                (held[0], held[1], spent[0], spent[1], goal_id),
            )

    def finish(
        self,
        goal_id: str,
        *,
        state: str,
        status: str,
        reason: str | None,
        spent: tuple[int, int],
        record: str | None,
        prior: tuple[int, int] | None = None,
    ) -> None:
        """The goal's attempt ended (``state``: succeeded, failed or skipped). ``prior``, when
        given, is what earlier attempts spent as another process counted it."""
        if state not in FINAL_STATES:
            raise ValueError(state)
        with self.transaction() as db:
            if prior is not None:
                db.execute(
                    "UPDATE goals SET prior_tokens = ?, prior_pico = ? WHERE id = ?",
                    (prior[0], prior[1], goal_id),
                )
            db.execute(
                "UPDATE goals SET state = ?, status = ?, reason = ?, held_tokens = 0, "
                "held_pico = 0, spent_tokens = ?, spent_pico = ?, finished_at = ?, record = ? "
                "WHERE id = ?",
                (state, status, reason, spent[0], spent[1], time.time(), record, goal_id),
            )


def lock_batch(out: Path) -> DirectoryLock:
    """Take ``out``'s batch lock for this process, or fail if another process holds it: two
    processes running one batch would each run its pending goals and each spend what is left
    of its budget."""
    return lock_directory(
        out,
        LOCK,
        what="the batch directory",
        wait="wait for it to end (or stop it) before resuming the batch",
    )


def open_journal(out: Path, *, resume: bool) -> Journal:
    """The journal of ``out``: a new one (``out`` must not hold a batch yet) or, with
    ``resume``, the existing one; either way with the directory's lock held."""
    path = out / JOURNAL
    if resume:
        if not path.exists():
            raise UserInputError(f"nothing to resume: {out} holds no batch journal ({JOURNAL})")
        lock = lock_batch(out)
        journal: Journal | None = None
        try:
            if path.stat().st_size == 0:
                raise damaged_journal(path, "it is empty")
            journal = Journal(path, lock, create=False)
            journal.check()
        except (sqlite3.DatabaseError, UserInputError, OSError) as exc:
            if journal is not None:
                journal.close()
            else:
                lock.release()
            if isinstance(exc, UserInputError):
                raise
            raise damaged_journal(path, str(exc)) from None
        return journal
    if path.exists():
        raise UserInputError(
            f"{out} already holds a batch: pass --resume to continue it, or choose another --out"
        )
    return Journal(path, lock_batch(out))
