"""The data-migration scenario: the seed's own example and the demo.

A deterministic sample shop database (14 tables, foreign keys, about 290,000 rows) is migrated into
a second SQLite database with real tools. The root planner splits the goal into sub-goals
(schema, data per table group, indexes, verification); sub-planners plan the leaves; foreign keys
make the leaves a DAG, so independent tables copy concurrently. The verifier compares every table
of target and source (counts, checksums, indexes) and checks foreign-key integrity.
"""

from __future__ import annotations

from contextlib import closing
from pathlib import Path

from hierplan.scenarios.base import Scenario, ScenarioEnv, Verification
from hierplan.scenarios.data_migration.database import build_source, is_built
from hierplan.scenarios.data_migration.oracle import ROOT_GOAL, MigrationOracle
from hierplan.scenarios.data_migration.tools import (
    Databases,
    MigrationStats,
    make_tools,
    verify,
)

STATS_FILE = "migration_stats.json"
"""The migration's counters in its run directory, kept over a pause."""


class DataMigration(Scenario):
    """Migrate the sample shop database into a new SQLite database."""

    name = "data_migration"
    description = "migrate a 14-table, 290k-row SQLite shop database into a new one, verified"

    def setup(self, workdir: Path, *, seed: int = 0) -> ScenarioEnv:
        """Build (or reuse) the source database and start from an empty target."""
        target = workdir / "target.db"
        for suffix in ("", "-wal", "-shm"):
            Path(f"{target}{suffix}").unlink(missing_ok=True)
        (workdir / STATS_FILE).unlink(missing_ok=True)  # the counters of that target
        return self.reopen(workdir, seed=seed)

    def replaced_files(self, workdir: Path, *, seed: int = 0) -> list[Path]:
        """The target database (setup starts from an empty one) and a source database that is
        not the sample one (setup builds it again); the sample source is reused as it is."""
        source, target = workdir / "source.db", workdir / "target.db"
        replaced = [target] if target.exists() else []
        if source.exists() and not is_built(source):
            replaced.append(source)
        return replaced

    def reopen(self, workdir: Path, *, seed: int = 0) -> ScenarioEnv:
        """The source and the target as they are: what a paused run has migrated stays, and
        so do its counters (rows copied, copy time)."""
        source = build_source(workdir / "source.db", seed=0)
        target = workdir / "target.db"
        db = Databases(source, target, MigrationStats.load(workdir / STATS_FILE))
        with closing(db.read()) as conn:
            parents = {
                t: [r[2] for r in conn.execute(f'PRAGMA foreign_key_list("{t}")').fetchall()]
                for t in db.tables
            }
        return ScenarioEnv(
            goal=ROOT_GOAL,
            tools=make_tools(db),
            oracle=MigrationOracle(db.tables, parents),
            verify=lambda: verify_migration(db),
            info={"databases": db, "source": str(source), "target": str(target)},
        )


def verify_migration(db: Databases) -> Verification:
    """Ground truth: every table matches and the target's foreign keys hold."""
    tables = {t: verify(db, t) for t in db.tables}
    bad = sorted(t for t, r in tables.items() if not r["match"])
    with closing(db.write()) as conn:
        fk_violations = len(conn.execute("PRAGMA foreign_key_check").fetchall())
    rows = sum(int(r["target_rows"]) for r in tables.values())
    ok = not bad and fk_violations == 0
    summary = (
        f"{len(tables) - len(bad)}/{len(tables)} tables match the source ({rows:,} rows); "
        f"{fk_violations} foreign-key violations"
    )
    if bad:
        summary += f"; mismatched: {', '.join(bad)}"
    return Verification(
        ok=ok,
        summary=summary,
        details={
            "tables": tables,
            "tables_done": len(tables) - len(bad),
            "rows": rows,
            "foreign_key_violations": fk_violations,
            "rows_copied": db.stats.rows_copied,
            "rows_per_second": round(db.stats.rows_per_second),
            "peak_concurrent_copies": db.stats.peak_copies,
        },
    )


__all__ = ["ROOT_GOAL", "DataMigration", "verify_migration"]
