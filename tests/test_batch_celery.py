"""Celery: two worker processes, one SIGKILLed mid-goal; the goal's lease lapses, it is queued
again and finishes on the other worker; the batch's budget is never exceeded, and what the
killed delivery spent is counted once (marked ``celery``: ``.ci/run`` runs it)."""

from __future__ import annotations

import json
import signal
import sqlite3
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
LEASE_S = 3
# Far beyond any wait here: only the lease can bring a killed worker's goal back in time.
VISIBILITY_S = 3600
GOALS = 6
# Goals at once in the batch, and on each worker: whatever the killed worker ran, the other one
# has a free slot for each of those goals, so their recovery waits for no other goal.
SLOTS = 3


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
            str(SLOTS),
            "--visibility-timeout",
            str(VISIBILITY_S),
            "--workdir",
            str(workdir),
        ],
        stdout=_log(log),
        stderr=subprocess.STDOUT,
    )


def _driver(url: str, goals: Path, out: Path, budget: float, log: Path) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [str(BIN / "hierplan"), "batch", str(goals), "--out", str(out),
         "--backend", "celery", "--broker", url, "--budget-usd", str(budget),
         "--concurrency", str(SLOTS), "--sim-latency-scale", "1",
         "--visibility-timeout", str(VISIBILITY_S), "--lease", str(LEASE_S)],
        stdout=_log(log),
        stderr=subprocess.STDOUT,
    )  # fmt: skip


def _namespace(out: Path) -> str | None:
    """The batch's namespace in Redis, once the driver has journaled it."""
    if not (out / "journal.sqlite").exists():
        return None
    journal = Journal(out / "journal.sqlite", create=False)
    try:
        namespace = journal.meta().get("namespace")
    except sqlite3.OperationalError:  # the driver has not written its tables yet
        return None
    finally:
        journal.close()
    return None if namespace is None else str(namespace)


def _goal_states(client: Any, namespace: str) -> dict[str, dict[str, str]]:
    """Each goal's hash in Redis."""
    return {
        f"line-{i}": cast(dict[str, str], client.hgetall(goal_key(namespace, f"line-{i}")))
        for i in range(1, GOALS + 1)
    }


def _journaled_state(out: Path, goal_id: str) -> str:
    journal = Journal(out / "journal.sqlite", create=False)
    try:
        return journal.row(goal_id).state
    finally:
        journal.close()


def _logs(tmp_path: Path) -> str:
    return "\n".join(
        f"--- {p.name}\n{p.read_text(errors='replace')}" for p in sorted(tmp_path.glob("*.log"))
    )


def _kill_mid_goal(client: Any, out: Path, victim: subprocess.Popen[bytes]) -> tuple[str, str]:
    """SIGKILL ``victim`` as soon as a goal it runs has made or holds model calls; the batch's
    namespace and that goal."""
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        time.sleep(0.05)
        namespace = _namespace(out)
        if namespace is None:
            continue
        for goal_id, state in _goal_states(client, namespace).items():
            account = state.get("account")
            if not account or not state.get("worker", "").endswith(f":{victim.pid}"):
                continue
            figures = client.hmget(f"{{{namespace}}}:a:{account}", ["sp", "rp"])
            if any(f not in (None, "0") for f in figures):  # calls made or held
                victim.send_signal(signal.SIGKILL)
                victim.wait()
                return namespace, goal_id
    raise AssertionError("no goal ran on the first worker")


def test_a_killed_workers_goal_finishes_on_the_other_worker_within_its_lease(
    tmp_path: Path,
) -> None:
    if not redis_available():
        pytest.skip("redis-server is not installed (apt-get install redis-server)")
    server = RedisServer()
    workers: list[subprocess.Popen[bytes]] = []
    try:
        goals = tmp_path / "goals.jsonl"
        goals.write_text(
            "".join(json.dumps({"suite": "crafting", "task": i}) + "\n" for i in range(GOALS))
        )
        out = tmp_path / "out"
        workers = [_worker(server.url, tmp_path / f"w{i}", tmp_path / f"w{i}.log") for i in (0, 1)]
        budget = 0.2
        driver = _driver(server.url, goals, out, budget, tmp_path / "driver.log")
        client = connect(server.url)
        victim, survivor = workers
        namespace, killed_goal = _kill_mid_goal(client, out, victim)
        killed_at = time.monotonic()
        # Followed through the journal and Redis, not slept for: the goal's lease lapses, the
        # driver queues it again, the other worker claims it, and it is journaled as final.
        claimed_after = finished_after = None
        deadline = killed_at + 120
        while finished_after is None and time.monotonic() < deadline:
            time.sleep(0.05)
            state = cast(dict[str, str], client.hgetall(goal_key(namespace, killed_goal)))
            if claimed_after is None and state.get("worker", "").endswith(f":{survivor.pid}"):
                claimed_after = time.monotonic() - killed_at
            if _journaled_state(out, killed_goal) in ("succeeded", "failed"):
                finished_after = time.monotonic() - killed_at
        assert finished_after is not None, _logs(tmp_path)
        claimed = "unseen" if claimed_after is None else f"{claimed_after:.1f} s"
        print(
            f"\nrecovery with a {LEASE_S} s lease: {killed_goal} claimed by the other worker "
            f"{claimed} after SIGKILL, finished {finished_after:.1f} s after"
        )
        driver.wait(timeout=300)
        assert driver.returncode in (0, 1), _logs(tmp_path)
        journal = Journal(out / "journal.sqlite")
        rows = {r.id: r for r in journal.rows()}
        meta = journal.meta()
        attempts = {r.id: r.attempts for r in rows.values()}
        assert all(r.state in ("succeeded", "failed") for r in rows.values()), _logs(tmp_path)
        killed = rows[killed_goal]
        assert killed.record is not None  # delivered again and finished
        assert attempts[killed_goal] == 2  # each delivery that started it is counted
        assert set(attempts.values()) <= {1, 2}
        assert killed.prior_pico > 0  # the killed attempt's spend stays spent
        # The shared ledger's figures, kept in the journal before its keys left Redis: what
        # the killed delivery spent and held is counted once, in the ledger as in the journal.
        ledger = meta["ledger"]
        assert ledger["granted_pico"] == 0
        assert ledger["spent_pico"] <= usd_to_pico(budget)
        assert ledger["spent_pico"] == journal.spent()[1]
        assert list(client.scan_iter(match=f"{{{meta['namespace']}}}:*")) == []
        assert len(list((out / "goals").glob("*/run.json"))) == GOALS
        journal.close()
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
