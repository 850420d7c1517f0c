"""Celery: two worker processes run a batch of goals that use MCP servers, each worker starting
what its goals need from the same configuration: each goal's own filesystem server, and one
shared server per worker, given a ``${VAR}`` read from the workers' environment (not the
driver's) and written to no file the batch leaves. A goal whose server cannot be started on the
worker, or whose variable the worker does not have, fails with the reason, and the batch goes on
(marked ``celery``: ``.ci/run`` runs it)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest
from npm_support import FILESYSTEM, npm_server
from redis_support import RedisServer, redis_available
from toolset_batches import MODEL, goals_file, model_server
from wire import TEST_KEY

from hierplan.batch.journal import Journal
from hierplan.records import RunResult

pytestmark = pytest.mark.celery
BIN = Path(sys.executable).parent
GOALS = 20


def _start(
    args: list[str], log: Path, extra: dict[str, str] | None = None
) -> subprocess.Popen[bytes]:
    env = {**os.environ, "OPENAI_API_KEY": TEST_KEY, **(extra or {})}
    with log.open("wb") as handle:
        return subprocess.Popen(
            [str(BIN / "hierplan"), *args], stdout=handle, stderr=subprocess.STDOUT, env=env
        )


def _logs(tmp_path: Path) -> str:
    return "\n".join(
        f"--- {p.name}\n{p.read_text(errors='replace')}" for p in tmp_path.glob("*.log")
    )


def test_workers_start_the_servers_their_goals_need(tmp_path: Path) -> None:
    if not redis_available():
        pytest.skip("redis-server is not installed (apt-get install redis-server)")
    filesystem = npm_server(FILESYSTEM)
    server = RedisServer()
    workers: list[subprocess.Popen[bytes]] = []
    try:
        goals = tmp_path / "goals.jsonl"
        dirs = goals_file(
            goals, tmp_path / "dirs", GOALS, filesystem, token_variable="NOTES_TOKEN_ON_WORKERS"
        )
        broken: dict[str, Any] = {"mcp": {"command": "/no/such/mcp-server"}}
        unset: dict[str, Any] = {"mcp": {"url": "http://127.0.0.1:9/mcp?t=${NOT_ON_WORKERS}"}}
        line = {"goal": "Write note 99 into /nowhere", "model": MODEL}
        with goals.open("a") as handle:
            handle.write(json.dumps(line | {"id": "broken", "tools": [broken]}) + "\n")
            handle.write(json.dumps(line | {"id": "unset", "tools": [unset]}) + "\n")
        token = f"tok-{uuid.uuid4().hex}"
        worker = ["worker", "--broker", server.url, "--concurrency", "3"]
        traces = [tmp_path / f"w{i}.trace.jsonl" for i in (0, 1)]
        workers = [
            _start(
                [*worker, "--workdir", str(tmp_path / f"w{i}"), "--trace", f"jsonl={traces[i]}"],
                tmp_path / f"w{i}.log",
                {"NOTES_TOKEN_ON_WORKERS": token},
            )
            for i in (0, 1)
        ]
        out = tmp_path / "out"
        with model_server() as model:
            driver = _start(
                ["batch", str(goals), "--out", str(out), "--backend", "celery",
                 "--broker", server.url, "--concurrency", "6",
                 "--base-url", model.openai_base_url],
                tmp_path / "driver.log",
            )  # fmt: skip
            driver.wait(timeout=300)
        assert driver.returncode == 1, _logs(tmp_path)  # every goal but the broken one
        journal = Journal(out / "journal.sqlite")
        rows = {row.id: row for row in journal.rows()}
        journal.close()
        assert rows["broken"].state == "failed"
        assert "command '/no/such/mcp-server' is not found" in (rows["broken"].reason or "")
        assert rows["unset"].state == "failed"
        assert "${NOT_ON_WORKERS} is not set" in (rows["unset"].reason or "")
        pids = set()
        for i, where in enumerate(dirs):
            assert rows[f"g{i}"].state == "succeeded", (rows[f"g{i}"].reason, _logs(tmp_path))
            assert (where / "note.txt").read_text() == f"note {i}"
            record = RunResult.load(out / "goals" / f"g{i}" / "run.json")
            pids.add(next(n.output for n in record.nodes() if n.step_id == "who"))
        assert 1 <= len(pids) <= 2  # one shared server per worker process, not one per goal
        assert b"${NOTES_TOKEN_ON_WORKERS}" in (out / "journal.sqlite").read_bytes()
        # The journal, run records, worker directories, traces and logs.
        left = [p for p in [*out.rglob("*"), *tmp_path.glob("w*/**/*")] if p.is_file()]
        left += [p for p in [*traces, *tmp_path.glob("*.log")] if p.exists()]
        assert len(left) > GOALS and any(p.stat().st_size > 0 for p in traces if p.exists())
        for path in left:
            assert token.encode() not in path.read_bytes(), path
    finally:
        for process in workers:
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
                try:
                    process.wait(20)
                except subprocess.TimeoutExpired:
                    process.kill()
        server.stop()
