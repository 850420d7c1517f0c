"""Batch throughput: simulator goals per second on the local backend, and the Redis ledger's
reserve+settle pairs per second (against the local ledger in the same run, as the baseline).

    python benchmarks/batch.py [--goals 8] [--concurrency 4] [--pairs 2000]

Needs ``redis-server`` on the PATH for the Redis figure (a server is started on a free port).
"""

from __future__ import annotations

import argparse
import json
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import anyio

from hierplan.batch import BatchBudget, BatchConfig, RunOptions, run_batch
from hierplan.budgets.budget import Fixed, Ledger, LocalLedger, usd_to_pico
from hierplan.budgets.redis_ledger import RedisLedger, connect


async def pairs_per_second(ledger: Ledger, pairs: int) -> float:
    root = await ledger.open("batch", None, Fixed(None, usd_to_pico(1_000)))
    started = time.perf_counter()
    for _ in range(pairs):
        held = await ledger.reserve(root, 100, 10_000, "execution")
        assert held is not None
        await ledger.settle(held, 50, 5_000)
    return pairs / (time.perf_counter() - started)


def local_goals_per_second(goals: int, concurrency: int) -> float:
    work = Path(tempfile.mkdtemp(prefix="hierplan-bench-"))
    try:
        path = work / "goals.jsonl"
        path.write_text(
            "".join(
                json.dumps({"scenario": "data_migration", "seed": i}) + "\n" for i in range(goals)
            )
        )
        config = BatchConfig(
            path,
            work / "out",
            BatchBudget(None, usd_to_pico(100), concurrency),
            RunOptions(sim_latency_scale=0),
        )
        summary = anyio.run(run_batch, config)
        return float(summary["goals_per_s"])
    finally:
        shutil.rmtree(work, ignore_errors=True)


def redis_pairs(pairs: int) -> float | None:
    server = shutil.which("redis-server")
    if server is None:
        return None
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    work = tempfile.mkdtemp(prefix="hierplan-redis-")
    process = subprocess.Popen(
        [server, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--dir", work],
        stdout=subprocess.DEVNULL,
    )
    try:
        client = connect(f"redis://127.0.0.1:{port}/0")
        for _ in range(100):
            try:
                client.ping()
                break
            except Exception:
                time.sleep(0.05)
        return anyio.run(pairs_per_second, RedisLedger(client), pairs)
    finally:
        process.terminate()
        process.wait()
        shutil.rmtree(work, ignore_errors=True)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--goals", type=int, default=8)
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--pairs", type=int, default=2000)
    args = parser.parse_args(argv)
    figures: dict[str, Any] = {
        "local_ledger_pairs_per_s": anyio.run(pairs_per_second, LocalLedger(), args.pairs),
        "redis_ledger_pairs_per_s": redis_pairs(args.pairs),
        "local_backend_goals_per_s": local_goals_per_second(args.goals, args.concurrency),
    }
    if figures["redis_ledger_pairs_per_s"]:
        figures["redis_vs_local"] = (
            figures["redis_ledger_pairs_per_s"] / figures["local_ledger_pairs_per_s"]
        )
    for name, value in figures.items():
        print(f"{name}: {value if value is None else f'{value:,.3f}'}")
    return figures


if __name__ == "__main__":
    main(sys.argv[1:])
