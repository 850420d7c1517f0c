"""Runs under injected provider faults: how many complete, and what the rest died of.

Whole data-migration runs against the tests' local wire server (no real provider), alternating
OpenAI and Anthropic formats, with a share of requests faulted (429, 500, 503/529, slow past the
timeout, malformed JSON, missing usage, cut-off body; seeded, so a seed is the same run each
time). A run completes when it succeeds and its verification passes. For each run: the model
attempts it made, the faults that failed one, the rounds of retries its nodes got after a pause
when a call had spent its own (``transient_retries``), and for a run that did not complete, its
error. Runs go a few at a time, each with its
own server and work directory.

Run: ``.venv/bin/python benchmarks/faults.py`` (``--runs``, ``--rate``, ``--at-once``,
``--first-seed``, ``--model-retries``).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import anyio

import hierplan

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from hierplan.scenarios import get_scenario  # noqa: E402

MODELS = {"openai": "openai:gpt-5-mini", "anthropic": "anthropic:claude-haiku-4-5"}
KEY = "test-key"


async def one_run(provider: str, rate: float, seed: int, retries: int) -> dict[str, Any]:
    """One data-migration run with ``rate`` of its requests faulted (draws seeded by ``seed``)."""
    from wire import OracleBackend, WireServer

    workdir = Path(tempfile.mkdtemp(prefix="hierplan-faults-"))
    oracle = get_scenario("data_migration").setup(workdir).oracle
    with WireServer(OracleBackend(oracle), slow_s=0.6) as server:
        server.faults.random(rate, seed=seed)
        result = await hierplan.run(
            scenario="data_migration",
            model=hierplan.ModelSpec(
                name=MODELS[provider],
                base_url=server.base_url(provider),
                api_key=KEY,
                timeout_s=0.3,
            ),
            workdir=workdir,
            settings=hierplan.RunSettings(retry_backoff_s=0.05, model_retries=retries),
        )
        faults = server.failures()
    nodes = list(result.nodes())
    calls = [c for n in nodes for c in n.calls]
    completed = result.status == "succeeded" and bool((result.verification or {}).get("ok"))
    return {
        "provider": provider,
        "seed": seed,
        "completed": completed,
        "status": result.status,
        "error": None if completed else result.error,
        "attempts": len(calls),
        "failed_attempts": sum(not c.ok for c in calls),
        "faults_injected": faults,
        "transient_retries": sum(n.transient_retries for n in nodes),
    }


async def fault_runs(
    runs: int, rate: float, at_once: int, first_seed: int, retries: int
) -> list[dict[str, Any]]:
    """``runs`` runs, alternating providers, ``at_once`` at a time."""
    rows: list[dict[str, Any]] = []
    limit = anyio.Semaphore(at_once)

    async def one(index: int) -> None:
        async with limit:
            provider = ("openai", "anthropic")[index % 2]
            row = await one_run(provider, rate, first_seed + index, retries)
            rows.append(row)
            mark = "ok" if row["completed"] else f"NOT COMPLETED: {row['error']}"
            print(f"{provider:9} seed {row['seed']:4}  {mark}", flush=True)

    async with anyio.create_task_group() as group:
        for index in range(runs):
            group.start_soon(one, index)
    return sorted(rows, key=lambda r: r["seed"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--runs", type=int, default=100, help="faulted runs in all")
    parser.add_argument("--rate", type=float, default=0.3, help="share of faulted requests")
    parser.add_argument("--at-once", type=int, default=4, help="runs going at the same time")
    parser.add_argument("--first-seed", type=int, default=100, help="seed of the first run")
    parser.add_argument("--model-retries", type=int, default=3, help="retries of one call")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results")
    parser.add_argument("--no-out", action="store_true", help="print only")
    args = parser.parse_args()
    started = time.perf_counter()
    rows = anyio.run(
        fault_runs, args.runs, args.rate, args.at_once, args.first_seed, args.model_retries
    )
    done = sum(r["completed"] for r in rows)
    summary = {
        "runs": len(rows),
        "rate": args.rate,
        "model_retries": args.model_retries,
        "completed": done,
        "completion_rate": round(done / len(rows), 4),
        "attempts_per_run": round(sum(r["attempts"] for r in rows) / len(rows), 1),
        "failed_attempts_per_run": round(sum(r["failed_attempts"] for r in rows) / len(rows), 1),
        "transient_retries": sum(r["transient_retries"] for r in rows),
        "seconds": round(time.perf_counter() - started, 1),
    }
    print(f"\n{done}/{len(rows)} runs completed with {args.rate:.0%} of requests faulted")
    print(json.dumps(summary, indent=1))
    if not args.no_out:
        args.out.mkdir(parents=True, exist_ok=True)
        path = args.out / "faults.json"
        path.write_text(json.dumps({"summary": summary, "runs": rows}, indent=1) + "\n")
        print(f"written to {path}")


if __name__ == "__main__":
    main()
