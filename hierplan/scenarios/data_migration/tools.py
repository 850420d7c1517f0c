"""The migration tools: real SQLite work, safe against untrusted arguments.

Arguments come from a model, so they are untrusted: every tool accepts only table names that exist
in the source database, quotes every identifier, reads only the source (opened read-only) and
writes only the target, and builds all SQL itself from the source's catalogue. No tool runs SQL
text that a model wrote. Each call opens its own connections, so tools run concurrently in worker
threads; the target uses WAL mode and a busy timeout so that concurrent copies interleave batch by
batch.
"""

from __future__ import annotations

import hashlib
import json
import math
import sqlite3
import threading
import time
from contextlib import closing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hierplan.errors import ToolArgsError, ToolBlocked, ToolError
from hierplan.files import write_atomic
from hierplan.scenarios.data_migration.database import quote
from hierplan.tools.base import Tool, tool

BUSY_TIMEOUT_MS = 60_000
MAX_BATCH = 50_000


_SAVED = ("rows_copied", "copy_seconds", "peak_copies", "busy_seconds")


@dataclass
class MigrationStats:
    """Counters the demo reports: rows copied, copy time, peak concurrent copies.

    With a ``path``, the counters are saved there after every copy and :meth:`load` reads them
    back, so that a run paused for review and resumed in another process reports the whole
    migration, not the part after the pause.
    """

    rows_copied: int = 0
    copy_seconds: float = 0.0
    active_copies: int = 0
    peak_copies: int = 0
    busy_seconds: float = 0.0
    _busy_since: float = 0.0
    lock: threading.Lock = field(default_factory=threading.Lock)
    path: Path | None = None

    @classmethod
    def load(cls, path: Path) -> MigrationStats:
        """The counters saved at ``path``; zero when there are none (a new migration) or the
        file is not one this class wrote (they are figures to report, not data to keep)."""
        try:
            saved = json.loads(path.read_text())
            values = {k: saved[k] for k in _SAVED}
        except (OSError, ValueError, TypeError, KeyError):
            return cls(path=path)
        if not all(_count(v) for v in values.values()):
            return cls(path=path)
        return cls(
            rows_copied=int(values["rows_copied"]),
            copy_seconds=float(values["copy_seconds"]),
            peak_copies=int(values["peak_copies"]),
            busy_seconds=float(values["busy_seconds"]),
            path=path,
        )

    def _save(self) -> None:
        # Under the lock, by the copy that just ended. Not durable: losing the counters of the
        # last copy in a power cut costs a figure in a report, and a copy should not wait on
        # the disk for it.
        if self.path is not None:
            text = json.dumps({k: getattr(self, k) for k in _SAVED})
            write_atomic(self.path, text, durable=False)

    def start_copy(self) -> None:
        """A copy started."""
        with self.lock:
            if self.active_copies == 0:
                self._busy_since = time.perf_counter()
            self.active_copies += 1
            self.peak_copies = max(self.peak_copies, self.active_copies)

    def end_copy(self, rows: int, seconds: float) -> None:
        """A copy ended after copying ``rows`` rows in ``seconds``."""
        with self.lock:
            self.active_copies -= 1
            self.rows_copied += rows
            self.copy_seconds += seconds
            if self.active_copies == 0:
                self.busy_seconds += time.perf_counter() - self._busy_since
            self._save()

    @property
    def rows_per_second(self) -> float:
        """Rows copied per second of wall time during which at least one copy ran."""
        return self.rows_copied / self.busy_seconds if self.busy_seconds > 0 else 0.0


def _count(value: object) -> bool:
    """Whether ``value`` is a saved counter: a finite number, not negative (JSON reads NaN)."""
    return (
        isinstance(value, int | float)
        and not isinstance(value, bool)
        and math.isfinite(value)
        and value >= 0
    )


class Databases:
    """The source and target database files, and safe access to them."""

    def __init__(self, source: Path, target: Path, stats: MigrationStats | None = None) -> None:
        self.source = source
        self.target = target
        self.stats = MigrationStats() if stats is None else stats
        with closing(self.read()) as conn:
            rows = conn.execute(
                "SELECT name FROM sqlite_master WHERE type='table' AND name NOT LIKE 'sqlite_%' "
                "AND name NOT LIKE '\\_%' ESCAPE '\\' ORDER BY name"
            ).fetchall()
        self.tables: tuple[str, ...] = tuple(r[0] for r in rows)
        with closing(self.write()) as conn:
            conn.execute("PRAGMA journal_mode=WAL")

    def read(self) -> sqlite3.Connection:
        """A read-only connection to the source."""
        return sqlite3.connect(
            f"file:{self.source}?mode=ro", uri=True, timeout=BUSY_TIMEOUT_MS / 1000
        )

    def write(self) -> sqlite3.Connection:
        """A connection to the target with foreign keys enforced."""
        conn = sqlite3.connect(self.target, timeout=BUSY_TIMEOUT_MS / 1000)
        conn.execute("PRAGMA foreign_keys=ON")
        return conn

    def check(self, table: str) -> str:
        """``table`` if it exists in the source; otherwise a :class:`ToolArgsError`."""
        if table not in self.tables:
            raise ToolArgsError(f"unknown table {table!r}: the source has {', '.join(self.tables)}")
        return table

    def target_has(self, conn: sqlite3.Connection, table: str) -> bool:
        """Whether the target already has ``table``."""
        row = conn.execute(
            "SELECT 1 FROM sqlite_master WHERE type='table' AND name=?", (table,)
        ).fetchone()
        return row is not None


def _columns(conn: sqlite3.Connection, table: str) -> list[dict[str, Any]]:
    rows = conn.execute(f"PRAGMA table_info({quote(table)})").fetchall()
    return [
        {"name": r[1], "type": r[2], "notnull": bool(r[3]), "default": r[4], "pk": r[5]}
        for r in rows
    ]


def _foreign_keys(conn: sqlite3.Connection, table: str) -> list[dict[str, str]]:
    rows = conn.execute(f"PRAGMA foreign_key_list({quote(table)})").fetchall()
    return [{"column": r[3], "references": r[2], "to": r[4] or "id"} for r in rows]


def _indexes(conn: sqlite3.Connection, table: str) -> list[dict[str, Any]]:
    out = []
    for r in conn.execute(f"PRAGMA index_list({quote(table)})").fetchall():
        name, origin = r[1], r[3]
        if origin != "c":  # only indexes made by CREATE INDEX; pk/unique ones come with the table
            continue
        cols = [c[2] for c in conn.execute(f"PRAGMA index_info({quote(name)})").fetchall()]
        out.append({"name": name, "columns": cols, "unique": bool(r[2])})
    return out


def _ddl(conn: sqlite3.Connection, table: str) -> str:
    cols = _columns(conn, table)
    pks = [c["name"] for c in sorted((c for c in cols if c["pk"]), key=lambda c: c["pk"])]
    parts = []
    for c in cols:
        part = f"{quote(c['name'])} {c['type']}"
        if len(pks) == 1 and c["pk"]:
            part += " PRIMARY KEY"
        if c["notnull"]:
            part += " NOT NULL"
        parts.append(part)
    if len(pks) > 1:
        parts.append(f"PRIMARY KEY ({', '.join(map(quote, pks))})")
    for fk in _foreign_keys(conn, table):
        ref = f"{quote(fk['references'])}({quote(fk['to'])})"
        parts.append(f"FOREIGN KEY ({quote(fk['column'])}) REFERENCES {ref}")
    return f"CREATE TABLE IF NOT EXISTS {quote(table)} ({', '.join(parts)})"


def _order_by(conn: sqlite3.Connection, table: str) -> str:
    pks = [
        c["name"]
        for c in sorted((c for c in _columns(conn, table) if c["pk"]), key=lambda c: c["pk"])
    ]
    return ", ".join(map(quote, pks)) if pks else "rowid"


def table_checksum(conn: sqlite3.Connection, table: str) -> tuple[int, str]:
    """Row count and a SHA-256 over every row in primary-key order."""
    digest = hashlib.sha256()
    count = 0
    for row in conn.execute(f"SELECT * FROM {quote(table)} ORDER BY {_order_by(conn, table)}"):
        digest.update(repr(row).encode())
        count += 1
    return count, digest.hexdigest()[:16]


def make_tools(db: Databases) -> list[Tool]:
    """The six migration tools bound to ``db``."""

    @tool(timeout_s=30)
    def list_tables() -> list[dict[str, Any]]:
        """List the source tables with their row counts."""
        with closing(db.read()) as conn:
            return [
                {"table": t, "rows": conn.execute(f"SELECT COUNT(*) FROM {quote(t)}").fetchone()[0]}
                for t in db.tables
            ]

    @tool(timeout_s=30)
    def read_schema(table: str) -> dict[str, Any]:
        """Read a source table's columns, foreign keys and indexes."""
        db.check(table)
        with closing(db.read()) as conn:
            return {
                "table": table,
                "columns": _columns(conn, table),
                "foreign_keys": _foreign_keys(conn, table),
                "indexes": _indexes(conn, table),
            }

    @tool(timeout_s=60)
    def create_table(table: str) -> str:
        """Create a source table's schema (columns, keys, foreign keys) in the target."""
        db.check(table)
        with closing(db.read()) as src:
            ddl = _ddl(src, table)
        conn = db.write()
        try:
            conn.execute(ddl)
            conn.commit()
        finally:
            conn.close()
        return f"created {table}"

    @tool(timeout_s=600)
    def copy_rows(table: str, batch_size: int = 5000) -> dict[str, Any]:
        """Copy every row of a source table into the same table in the target, in batches."""
        db.check(table)
        if not 1 <= batch_size <= MAX_BATCH:
            raise ToolArgsError(f"batch_size must be between 1 and {MAX_BATCH}, got {batch_size}")
        return _copy(db, table, batch_size)

    @tool(timeout_s=120)
    def create_indexes(table: str) -> dict[str, Any]:
        """Create a source table's indexes on the target table."""
        db.check(table)
        with closing(db.read()) as src:
            indexes = _indexes(src, table)
        conn = db.write()
        try:
            if not db.target_has(conn, table):
                raise ToolBlocked(f"the target has no table {table!r}: create it first")
            for ix in indexes:
                unique = "UNIQUE " if ix["unique"] else ""
                cols = ", ".join(map(quote, ix["columns"]))
                name = quote(ix["name"])
                conn.execute(
                    f"CREATE {unique}INDEX IF NOT EXISTS {name} ON {quote(table)} ({cols})"
                )
            conn.commit()
        finally:
            conn.close()
        return {"table": table, "indexes": [ix["name"] for ix in indexes]}

    @tool(timeout_s=120)
    def verify_table(table: str) -> dict[str, Any]:
        """Compare a table in source and target: row counts, checksums and indexes."""
        db.check(table)
        return verify(db, table)

    return [list_tables, read_schema, create_table, copy_rows, create_indexes, verify_table]


def _copy(db: Databases, table: str, batch_size: int) -> dict[str, Any]:
    started = time.perf_counter()
    copied = 0
    db.stats.start_copy()
    try:
        src = db.read()
        dst = db.write()
        try:
            if not db.target_has(dst, table):
                raise ToolBlocked(f"the target has no table {table!r}: create it first")
            cols = [c["name"] for c in _columns(src, table)]
            names = ", ".join(map(quote, cols))
            marks = ", ".join("?" * len(cols))
            insert = f"INSERT OR IGNORE INTO {quote(table)} ({names}) VALUES ({marks})"
            cursor = src.execute(
                f"SELECT {names} FROM {quote(table)} ORDER BY {_order_by(src, table)}"
            )
            while batch := cursor.fetchmany(batch_size):
                try:
                    with dst:
                        dst.executemany(insert, batch)
                except sqlite3.IntegrityError as exc:
                    raise _integrity_error(src, table, exc) from None
                except sqlite3.OperationalError as exc:
                    if "no such table" not in str(exc):
                        raise  # not a missing parent table: the database's own failure
                    raise _missing_parents(src, table) from None
                copied += len(batch)
        finally:
            src.close()
            dst.close()
    finally:
        db.stats.end_copy(copied, time.perf_counter() - started)
    return {"table": table, "rows": copied}


def _integrity_error(src: sqlite3.Connection, table: str, exc: sqlite3.IntegrityError) -> ToolError:
    # SQLite only says "FOREIGN KEY constraint failed".
    if "FOREIGN KEY" in str(exc):
        return _missing_parents(src, table)
    return ToolError(
        f"copying {table!r} violated a constraint ({exc}); rows copied before it are kept"
    )


def _missing_parents(src: sqlite3.Connection, table: str) -> ToolBlocked:
    # Name the parents so that whoever reads this knows what to copy first. Missing parent
    # rows (or a parent table not created yet) are work not done yet: the copy is blocked.
    parents = sorted({fk["references"] for fk in _foreign_keys(src, table)} - {table})
    return ToolBlocked(
        f"copying {table!r} violated a foreign key: rows reference parent rows missing from "
        f"{', '.join(parents) or 'its parent tables'}; copy those first. Rows copied before "
        "the failing batch are kept."
    )


def verify(db: Databases, table: str) -> dict[str, Any]:
    """Counts, checksums and index names of ``table`` on both sides."""
    with closing(db.read()) as src:
        s_count, s_sum = table_checksum(src, table)
        s_ix = sorted(ix["name"] for ix in _indexes(src, table))
    dst = db.write()
    try:
        if not db.target_has(dst, table):
            return {
                "table": table,
                "match": False,
                "problem": "missing table",
                "source_rows": s_count,
                "target_rows": 0,
            }
        t_count, t_sum = table_checksum(dst, table)
        t_ix = sorted(ix["name"] for ix in _indexes(dst, table))
    finally:
        dst.close()
    problems = []
    if s_count != t_count:
        problems.append("row count")
    if s_sum != t_sum:
        problems.append("checksum")
    if s_ix != t_ix:
        problems.append("missing indexes")
    return {
        "table": table,
        "match": not problems,
        "problem": ", ".join(problems),
        "source_rows": s_count,
        "target_rows": t_count,
        "checksum": t_sum,
    }
