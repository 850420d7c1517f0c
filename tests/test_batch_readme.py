"""The examples of the "Batch runs" page (docs/batch.md), run as written (the Celery ones against
a Redis server of the tests' own, in place of the page's ``127.0.0.1:6379``; marked ``celery``)."""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
from pathlib import Path

import docs_support
import pytest
from redis_support import RedisServer, redis_available

from hierplan.batch import parse_goals
from hierplan.batch.journal import Journal
from hierplan.units import usd_to_pico

BIN = Path(sys.executable).parent
PAGE_REDIS = "redis://127.0.0.1:6379/0"


def blocks(language: str) -> list[str]:
    """The page's fenced blocks whose info string is ``language``."""
    return docs_support.blocks(docs_support.page("batch.md"), language)


def command_block(containing: str) -> list[str]:
    (found,) = [b for b in blocks("sh") if containing in b]
    return found.strip().splitlines()


def _env() -> dict[str, str]:
    return dict(os.environ, PATH=f"{BIN}{os.pathsep}{os.environ['PATH']}", COLUMNS="120")


def _summary(where: Path) -> dict[str, object]:
    summary: dict[str, object] = json.loads((where / "summary.json").read_text())
    return summary


def test_the_goals_lines_are_valid() -> None:
    offline, free_text, with_tools = blocks("jsonl")
    goals = parse_goals(offline)
    assert [g.spec.kind for g in goals] == ["scenario", "suite", "suite", "suite", "suite"]
    (text,) = parse_goals(free_text)
    assert (text.id, text.spec.kind, text.spec.model) == ("q3", "text", "openai:gpt-5-mini")
    files, tickets = parse_goals(with_tools)
    assert [entry.saved() for entry in files.tools()] == [
        {
            "mcp": {
                "command": "npx",
                "args": ["-y", "@modelcontextprotocol/server-filesystem", "/srv/q3"],
            }
        }
    ]
    (shared,) = tickets.tools()
    assert shared.saved()["mcp"]["headers"] == {"Authorization": "Bearer ${TICKETS_TOKEN}"}


def test_the_batch_commands_run_as_written(tmp_path: Path) -> None:
    (tmp_path / "goals.jsonl").write_text(blocks("jsonl")[0])
    outputs, codes = [], []
    for line in command_block("--resume"):
        done = subprocess.run(
            line, shell=True, cwd=tmp_path, env=_env(), capture_output=True, text=True, timeout=300
        )
        codes.append(done.returncode)
        outputs.append(done.stdout + done.stderr)
    assert codes == [0, 0, 1], outputs
    first = _summary(tmp_path / "runs" / "batch")
    assert first["counts"] == {
        "succeeded": 5,
        "failed": 0,
        "skipped": 0,
        "pending": 0,
        "running": 0,
    }
    assert first["finished_by_this_run"] == 0  # the summary the resume (nothing to do) wrote
    small = _summary(tmp_path / "runs" / "small")
    counts = small["counts"]
    assert isinstance(counts, dict) and counts["skipped"] >= 1, small
    assert isinstance(small["spent_pico"], int) and small["spent_pico"] <= usd_to_pico(0.01)
    journal = Journal(tmp_path / "runs" / "small" / "journal.sqlite")
    reasons = {r.reason.split(":")[0] for r in journal.rows() if r.state == "skipped" and r.reason}
    journal.close()
    assert reasons == {"budget"}
    assert "skipped" in outputs[2] and "Traceback" not in "".join(outputs)


@pytest.mark.celery
def test_the_celery_commands_run_as_written(tmp_path: Path) -> None:
    if not redis_available():
        pytest.skip("redis-server is not installed (apt-get install redis-server)")
    (tmp_path / "goals.jsonl").write_text(blocks("jsonl")[0])
    install, worker_line, batch_line = command_block("--backend celery")
    assert install.startswith("pip install")  # the development install has the extra
    server = RedisServer()
    log = (tmp_path / "worker.log").open("wb")
    worker = subprocess.Popen(
        shlex.split(worker_line.replace(PAGE_REDIS, server.url)),
        cwd=tmp_path,
        env=_env(),
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:
        done = subprocess.run(
            batch_line.replace(PAGE_REDIS, server.url),
            shell=True,
            cwd=tmp_path,
            env=_env(),
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert done.returncode == 0, done.stdout + done.stderr
        summary = _summary(tmp_path / "runs" / "celery")
        counts = summary["counts"]
        assert isinstance(counts, dict) and counts["succeeded"] == 5, summary
    finally:
        worker.send_signal(signal.SIGTERM)
        try:
            worker.wait(30)
        except subprocess.TimeoutExpired:
            worker.kill()
            worker.wait()
        log.close()
        server.stop()
