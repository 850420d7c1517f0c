"""The data-migration demo end to end: the target equals the source."""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Sequence
from contextlib import closing
from pathlib import Path

import pytest

import hierplan
from hierplan.scenarios import get_scenario
from hierplan.scenarios.data_migration import STATS_FILE
from hierplan.scenarios.data_migration.database import ROWS
from hierplan.scenarios.data_migration.tools import Databases, table_checksum


def _tables(path: Path) -> dict[str, tuple[int, str]]:
    with closing(sqlite3.connect(path)) as conn:
        names = [
            r[0]
            for r in conn.execute(
                "SELECT name FROM sqlite_master WHERE type='table' AND name NOT LIKE '\\_%' "
                "ESCAPE '\\' AND name NOT LIKE 'sqlite_%'"
            )
        ]
        return {n: table_checksum(conn, n) for n in names}


@pytest.mark.anyio
async def test_demo_migrates_every_row(tmp_path: Path) -> None:
    result = await hierplan.run(
        scenario="data_migration", workdir=tmp_path, model=hierplan.Simulator(latency_scale=0)
    )
    assert result.status == "succeeded", result.error
    assert result.simulated
    assert result.verification is not None and result.verification["ok"]
    source = _tables(tmp_path / "source.db")
    target = _tables(tmp_path / "target.db")
    assert target == source
    assert sum(count for count, _ in source.values()) == sum(ROWS.values()) >= 200_000
    # three levels: root planner, sub-planners, leaves; leaves ran concurrently
    assert {n.depth for n in result.nodes()} == {1, 2, 3}
    assert result.stats["peak_concurrent_leaves"] > 1
    record = json.loads(result.to_json())
    assert record["totals"]["cost_usd"] == pytest.approx(
        sum(level["cost_usd"] for level in record["levels"])
    )


async def _copy_one_table(db: Databases, tools: Sequence[hierplan.Tool]) -> int:
    """Create and copy the first table that has no parent; the rows it copied."""
    by_name = {t.name: t for t in tools}
    with closing(db.read()) as conn:
        table = next(
            t for t in db.tables if not conn.execute(f'PRAGMA foreign_key_list("{t}")').fetchall()
        )
    await by_name["create_table"].call({"table": table})
    copied: int = (await by_name["copy_rows"].call({"table": table}))["rows"]
    return copied


@pytest.mark.anyio
@pytest.mark.parametrize("saved", [None, "{not json", '{"rows_copied": NaN}', "[1, 2]"])
async def test_the_copy_counters_survive_a_reopen_and_start_again_with_a_new_target(
    tmp_path: Path, saved: str | None
) -> None:
    """A run resumed in another process reopens the scenario: its counters go on from the
    paused part's; a new run (setup) starts them from zero, as it does the target. A counters
    file that is not one the scenario wrote counts as none."""
    scenario = get_scenario("data_migration")
    env = scenario.setup(tmp_path)
    if saved is not None:
        (tmp_path / STATS_FILE).write_text(saved)
        env = scenario.reopen(tmp_path)
    db: Databases = env.info["databases"]
    assert db.stats.rows_copied == 0
    copied = await _copy_one_table(db, env.tools)
    assert copied > 0 and db.stats.rows_copied == copied
    reopened: Databases = scenario.reopen(tmp_path).info["databases"]
    assert reopened.stats.rows_copied == copied and reopened.stats.peak_copies == 1
    assert reopened.stats.busy_seconds == db.stats.busy_seconds > 0
    fresh: Databases = scenario.setup(tmp_path).info["databases"]
    assert fresh.stats.rows_copied == 0 and not (tmp_path / STATS_FILE).exists()
