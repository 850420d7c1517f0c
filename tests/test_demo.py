"""The data-migration demo end to end: the target equals the source."""

from __future__ import annotations

import json
import sqlite3
from contextlib import closing
from pathlib import Path

import pytest

import hierplan
from hierplan.scenarios.data_migration.database import ROWS
from hierplan.scenarios.data_migration.tools import table_checksum


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
    result = await hierplan.run(scenario="data_migration", sim_latency_scale=0, workdir=tmp_path)
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
