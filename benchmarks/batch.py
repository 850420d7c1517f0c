"""Batch throughput: simulator goals per second on the local backend and on Celery with two
worker processes, and the Redis ledger's reserve+settle pairs per second.

    python benchmarks/batch.py [--goals 8] [--tasks 40] [--concurrency 4] [--workers 2]
                               [--pairs 2000] [--no-celery]

Two goals files, each run on both backends: ``--goals`` data_migration scenarios (a goal does
real work: it sets up and migrates SQLite databases) and ``--tasks`` game24 suite tasks (a goal
is a handful of cheap tool calls, so the figure is mostly the batch's own orchestration). The
simulator runs without latency. Every figure on Celery is reported against the local backend on
the same goals file in the same run, and the Redis ledger against the local ledger.

``--concurrency`` goals run at once on either backend: in one process locally; on Celery the
driver keeps that many enqueued, for ``--workers`` ``hierplan worker`` processes of
``concurrency / workers`` goals each, started here with a ``redis-server`` on a free loopback
port (Debian's ``redis-server`` on the PATH). A warm-up batch runs first so that worker start-up
is not timed.
"""

from __future__ import annotations

import argparse
import json
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import anyio

from hierplan.batch import BatchBudget, BatchConfig, RunOptions, run_batch
from hierplan.budgets.budget import Fixed
from hierplan.budgets.ledger import Ledger, LocalLedger
from hierplan.budgets.redis_ledger import RedisLedger, connect
from hierplan.units import usd_to_pico

BIN = Path(sys.executable).parent


async def pairs_per_second(ledger: Ledger, pairs: int) -> float:
    """Reserve+settle pairs per second on a goal's account under a batch root."""
    root = await ledger.open("batch", None, Fixed(None, usd_to_pico(1_000)))
    goal = await ledger.open("goal", root, Fixed(None, usd_to_pico(100)))
    started = time.perf_counter()
    for _ in range(pairs):
        held = await ledger.reserve(goal, 100, 10_000, "execution")
        assert held is not None
        await ledger.settle(held, 50, 5_000)
    return pairs / (time.perf_counter() - started)


def goals_files(work: Path, scenarios: int, tasks: int) -> dict[str, Path]:
    """The two workloads: data_migration scenarios and game24 suite tasks."""
    files: dict[str, list[dict[str, Any]]] = {
        "data_migration": [{"scenario": "data_migration"} for _ in range(scenarios)],
        "game24": [{"suite": "game24", "task": i} for i in range(tasks)],
    }
    paths = {}
    for name, lines in files.items():
        if lines:
            path = paths[name] = work / f"{name}.jsonl"
            path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return paths


def goals_per_second(
    goals: Path, out: Path, concurrency: int, broker: str | None = None
) -> dict[str, Any]:
    """Run one batch (local, or on Celery through ``broker``); its summary's figures."""
    config = BatchConfig(
        goals,
        out,
        BatchBudget(None, usd_to_pico(1_000), concurrency),
        RunOptions(sim_latency_scale=0),
        backend="celery" if broker else "local",
        broker=broker,
        visibility_timeout=600,
    )
    summary = anyio.run(run_batch, config)
    assert summary["counts"]["succeeded"] + summary["counts"]["failed"] == summary["goals"]
    return {"goals_per_s": summary["goals_per_s"], "wall_time_s": summary["wall_time_s"]}


@contextmanager
def redis_server() -> Iterator[str | None]:
    """A ``redis-server`` on a free loopback port (its URL), or ``None`` if not installed."""
    server = shutil.which("redis-server")
    if server is None:
        yield None
        return
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    work = tempfile.mkdtemp(prefix="hierplan-redis-")
    process = subprocess.Popen(
        [server, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--dir", work],
        stdout=subprocess.DEVNULL,
    )
    url = f"redis://127.0.0.1:{port}/0"
    try:
        client = connect(url)
        for _ in range(200):
            try:
                client.ping()
                break
            except Exception:
                time.sleep(0.05)
        client.close()
        yield url
    finally:
        process.terminate()
        process.wait()
        shutil.rmtree(work, ignore_errors=True)


@contextmanager
def workers(url: str, count: int, concurrency: int, work: Path) -> Iterator[None]:
    """``count`` ``hierplan worker`` processes on ``url``, stopped (SIGTERM) at the end."""
    started = []
    logs = []
    try:
        for i in range(count):
            log = (work / f"worker-{i}.log").open("wb")
            logs.append(log)
            command = [str(BIN / "hierplan"), "worker", "--broker", url]
            command += ["--concurrency", str(concurrency), "--visibility-timeout", "600"]
            command += ["--workdir", str(work / f"worker-{i}")]
            started.append(subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT))
        yield
    finally:
        for process in started:
            process.send_signal(signal.SIGTERM)
        for process in started:
            try:
                process.wait(30)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        for log in logs:
            log.close()


def redis_pairs(url: str, pairs: int) -> float:
    """The Redis ledger's pairs per second on the server at ``url``."""
    ledger = RedisLedger(connect(url))
    try:
        return anyio.run(pairs_per_second, ledger, pairs)
    finally:
        ledger.drop()
        ledger.client.close()


def measure(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    """Every figure, each next to its baseline from the same run."""
    figures: dict[str, Any] = {
        "local_ledger_pairs_per_s": anyio.run(pairs_per_second, LocalLedger(), args.pairs)
    }
    files = goals_files(work, args.goals, args.tasks)
    for name, path in files.items():
        local = goals_per_second(path, work / f"local-{name}", args.concurrency)
        figures[f"{name}_local_goals_per_s"] = local["goals_per_s"]
    with redis_server() as url:
        if url is None:
            return figures
        figures["redis_ledger_pairs_per_s"] = redis_pairs(url, args.pairs)
        figures["redis_vs_local_ledger"] = (
            figures["redis_ledger_pairs_per_s"] / figures["local_ledger_pairs_per_s"]
        )
        if args.no_celery:
            return figures
        each = max(1, args.concurrency // args.workers)
        with workers(url, args.workers, each, work):
            warm = goals_files(work / "warm", 0, args.concurrency)["game24"]
            goals_per_second(warm, work / "celery-warm", args.concurrency, url)
            for name, path in files.items():
                celery = goals_per_second(path, work / f"celery-{name}", args.concurrency, url)
                figures[f"{name}_celery_goals_per_s"] = celery["goals_per_s"]
                figures[f"{name}_celery_vs_local"] = (
                    celery["goals_per_s"] / figures[f"{name}_local_goals_per_s"]
                )
    return figures


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--goals", type=int, default=8, help="data_migration goals")
    parser.add_argument("--tasks", type=int, default=40, help="game24 suite-task goals")
    parser.add_argument("--concurrency", type=int, default=4, help="goals at once")
    parser.add_argument("--workers", type=int, default=2, help="Celery worker processes")
    parser.add_argument("--pairs", type=int, default=2000, help="ledger reserve+settle pairs")
    parser.add_argument("--no-celery", action="store_true", help="skip the Celery figures")
    args = parser.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="hierplan-bench-"))
    (work / "warm").mkdir()
    try:
        figures = measure(args, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print("(the machine may be shared: compare ratios, not absolute figures)")
    for name, value in figures.items():
        print(f"{name}: {value:,.3f}")
    return figures


if __name__ == "__main__":
    main(sys.argv[1:])
