"""Celery: two worker processes, one SIGKILLed mid-goal; the goal is delivered again and
finishes; the batch's budget is never exceeded (marked ``celery``: ``.ci/run`` runs it)."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, cast

import pytest
from batch_support import load_benchmark
from redis_support import RedisServer, redis_available

from hierplan.batch.celery_backend import goal_key
from hierplan.batch.journal import Journal
from hierplan.budgets.redis_ledger import connect
from hierplan.units import usd_to_pico

pytestmark = pytest.mark.celery
BIN = Path(sys.executable).parent
VISIBILITY_S = 12


LOGS: list[Any] = []


def _log(path: Path) -> Any:
    handle = path.open("wb")
    LOGS.append(handle)
    return handle


def _worker(url: str, workdir: Path, log: Path) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [
            str(BIN / "hierplan"),
            "worker",
            "--broker",
            url,
            "--concurrency",
            "2",
            "--visibility-timeout",
            str(VISIBILITY_S),
            "--workdir",
            str(workdir),
        ],
        stdout=_log(log),
        stderr=subprocess.STDOUT,
    )


def test_a_worker_killed_mid_goal_loses_nothing_and_overspends_nothing(tmp_path: Path) -> None:
    if not redis_available():
        pytest.skip("redis-server is not installed (apt-get install redis-server)")
    server = RedisServer()
    workers: list[subprocess.Popen[bytes]] = []
    try:
        goals = tmp_path / "goals.jsonl"
        goals.write_text(
            "".join(json.dumps({"scenario": "data_migration", "seed": i}) + "\n" for i in range(6))
        )
        out = tmp_path / "out"
        workers = [_worker(server.url, tmp_path / f"w{i}", tmp_path / f"w{i}.log") for i in (0, 1)]
        budget = 0.2
        driver = subprocess.Popen(
            [
                str(BIN / "hierplan"),
                "batch",
                str(goals),
                "--out",
                str(out),
                "--backend",
                "celery",
                "--broker",
                server.url,
                "--budget-usd",
                str(budget),
                "--concurrency",
                "4",
                "--sim-latency-scale",
                "0.2",
                "--visibility-timeout",
                str(VISIBILITY_S),
            ],
            stdout=_log(tmp_path / "driver.log"),
            stderr=subprocess.STDOUT,
        )
        client = connect(server.url)
        victim = workers[0]
        killed_goal = None
        deadline = time.monotonic() + 120
        while killed_goal is None and time.monotonic() < deadline:
            time.sleep(0.1)
            if not (out / "journal.sqlite").exists():
                continue
            journal = Journal(out / "journal.sqlite")
            namespace = str(journal.meta().get("namespace"))
            journal.close()
            for i in range(6):
                # The client decodes replies (decode_responses): str, not bytes.
                state = cast(dict[str, str], client.hgetall(goal_key(namespace, f"line-{i + 1}")))
                account = state.get("account")
                if not account or not state.get("worker", "").endswith(f":{victim.pid}"):
                    continue
                figures = client.hmget(f"{{{namespace}}}:a:{account}", ["sp", "rp"])
                if any(f not in (None, "0") for f in figures):  # calls made or held
                    victim.send_signal(signal.SIGKILL)
                    killed_goal = f"line-{i + 1}"
                    break
        assert killed_goal is not None, "no goal ran on the first worker"
        driver.wait(timeout=240)
        output = (tmp_path / "driver.log").read_bytes()
        assert driver.returncode in (0, 1), output.decode()
        journal = Journal(out / "journal.sqlite")
        rows = {r.id: r for r in journal.rows()}
        meta = journal.meta()
        assert all(r.state in ("succeeded", "failed") for r in rows.values()), output.decode()
        killed = rows[killed_goal]
        assert killed.record is not None  # delivered again and finished
        assert killed.prior_pico > 0  # the killed attempt's spend stays spent
        # The shared ledger's figures, kept in the journal before its keys left Redis.
        ledger = meta["ledger"]
        assert ledger["granted_pico"] == 0
        assert ledger["spent_pico"] <= usd_to_pico(budget)
        assert ledger["spent_pico"] == journal.spent()[1]  # the journal and the ledger agree
        assert list(client.scan_iter(match=f"{{{meta['namespace']}}}:*")) == []
        assert len(list((out / "goals").glob("*/run.json"))) == 6
        client.close()
    finally:
        for worker in workers:
            if worker.poll() is None:
                worker.send_signal(signal.SIGTERM)
                try:
                    worker.wait(20)
                except subprocess.TimeoutExpired:
                    worker.kill()
                    worker.wait()
        server.stop()
        while LOGS:
            LOGS.pop().close()


def test_the_batch_benchmark_measures_two_celery_workers_at_a_small_size() -> None:
    if not redis_available():
        pytest.skip("redis-server is not installed (apt-get install redis-server)")
    argv = ["--goals", "0", "--tasks", "6", "--pairs", "50", "--concurrency", "2"]
    figures = load_benchmark().main(argv)
    assert figures["game24_celery_goals_per_s"] > 0
    assert figures["game24_celery_vs_local"] == pytest.approx(
        figures["game24_celery_goals_per_s"] / figures["game24_local_goals_per_s"]
    )
