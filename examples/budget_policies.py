"""Run the data-migration demo under one USD budget with each allocation policy.

    python examples/budget_policies.py [USD]

For each policy: the run's status, what it spent of the budget, how many nodes ran out, and how
many tables were migrated. Everything runs offline on the simulator.
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

import hierplan
from hierplan.budgets import ALLOCATIONS


def compare(budget_usd: float) -> list[dict[str, object]]:
    """One row per allocation policy."""
    rows: list[dict[str, object]] = []
    for allocation in ALLOCATIONS:
        with tempfile.TemporaryDirectory() as workdir:
            result = hierplan.run_sync(
                scenario="data_migration",
                workdir=Path(workdir),
                model=hierplan.Simulator(latency_scale=0),
                budget={"usd": budget_usd, "allocation": allocation},
            )
        assert result.budget is not None
        verified = (result.verification or {}).get("summary", "")
        rows.append(
            {
                "allocation": allocation,
                "status": result.status,
                "spent_usd": result.budget["spent"]["usd"],
                "exhausted_nodes": len(result.budget["exhausted"]),
                "verified": verified.split(";")[0],
            }
        )
    return rows


def main() -> None:
    """Print the comparison."""
    budget_usd = float(sys.argv[1]) if len(sys.argv) > 1 else 0.02
    print(f"budget ${budget_usd:g}")
    for row in compare(budget_usd):
        print(
            f"{row['allocation']:<10} {row['status']:<10} spent ${row['spent_usd']:.4f}  "
            f"out of budget: {row['exhausted_nodes']} node(s)  {row['verified']}"
        )


if __name__ == "__main__":
    main()
