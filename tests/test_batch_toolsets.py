"""A batch of goals that use MCP servers, on the local backend: every line's toolsets checked
before anything starts, each goal's own filesystem server on its own directory, and a server the
goals share."""

from __future__ import annotations

import json
import sys
import uuid
from pathlib import Path

import pytest
from npm_support import FILESYSTEM, npm_server
from toolset_batches import SERVER, goals_file, model_server
from typer.testing import CliRunner
from wire import TEST_KEY

from hierplan.cli import app
from hierplan.records import RunResult

GOALS = 20


@pytest.fixture(autouse=True)
def _key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", TEST_KEY)


def test_twenty_goals_each_with_its_own_server_and_one_they_share(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The shared server gets a ``${VAR}`` read from this environment, whose value no file the
    batch leaves (journal, run records, trace) holds."""
    token = f"tok-{uuid.uuid4().hex}"
    monkeypatch.setenv("NOTES_TOKEN_FOR_BATCH", token)
    goals = tmp_path / "goals.jsonl"
    filesystem = npm_server(FILESYSTEM)
    dirs = goals_file(
        goals, tmp_path / "dirs", GOALS, filesystem, token_variable="NOTES_TOKEN_FOR_BATCH"
    )
    out, trace = tmp_path / "out", tmp_path / "trace.jsonl"
    with model_server() as server:
        args = ["batch", str(goals), "--out", str(out), "--concurrency", "4"]
        args += ["--trace", f"jsonl={trace}", "--base-url", server.openai_base_url]
        result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    summary = json.loads((out / "summary.json").read_text())
    assert summary["counts"]["succeeded"] == GOALS
    pids = set()
    for i, where in enumerate(dirs):
        assert (where / "note.txt").read_text() == f"note {i}"  # each goal's own directory
        record = RunResult.load(out / "goals" / f"g{i}" / "run.json")
        nodes = {n.step_id: n for n in record.nodes()}
        assert json.loads(nodes["read"].output or "") == {"content": f"note {i}"}
        pids.add(nodes["who"].output)
    assert len(pids) == 1  # one shared server for the whole batch
    journal = (out / "journal.sqlite").read_bytes()
    assert b"mcp_server.py" in journal and b'"shared": true' in journal  # entries as written
    assert b"${NOTES_TOKEN_FOR_BATCH}" in journal
    written = [p for p in out.rglob("*") if p.is_file()]
    assert len(written) > GOALS and trace.stat().st_size > 0
    for path in [*written, trace]:
        assert token.encode() not in path.read_bytes(), path


def test_a_batch_checks_every_lines_toolsets_before_anything_starts(tmp_path: Path) -> None:
    goals = tmp_path / "goals.jsonl"
    goals_file(goals, tmp_path / "dirs", 3, npm_server(FILESYSTEM))
    lines = goals.read_text().splitlines()
    quits = {"mcp": {"command": sys.executable, "args": ["-c", "import sys; sys.exit(1)"]}}
    twice = {"mcp": {"command": sys.executable, "args": [str(SERVER)]}}
    bad = [json.loads(line) for line in lines]
    bad[0]["tools"].append(quits)  # a server that does not start
    bad[1]["tools"] += [twice, twice]  # two tools of one name (twice)
    bad[2]["tools"].append({"python": "no_module_here:tools"})
    goals.write_text("\n".join(json.dumps(line) for line in bad) + "\n")
    out = tmp_path / "out"
    with model_server() as server:
        args = ["batch", str(goals), "--out", str(out), "--base-url", server.openai_base_url]
        result = CliRunner().invoke(app, args)
        hits = server.count()
    message = " ".join(result.output.split())
    assert result.exit_code == 2, result.output
    assert "line 3: tools entry 3 (python no_module_here:tools)" in message
    assert "line 1: tools entry 3 (mcp " in message and "cannot use MCP server" in message
    assert "line 2: tools entries 2 and 3 both have tools named add, lookup, slow" in message
    assert "line 2: tools entries 2 and 4 both have tools named add" in message
    assert not out.exists() and hits == 0  # nothing started, nothing written
    unknown = tmp_path / "unknown.jsonl"
    unknown.write_text(json.dumps({"goal": "x", "model": "openai:m", "tools": [{"ssh": 1}]}) + "\n")
    refused = CliRunner().invoke(app, ["batch", str(unknown), "--out", str(out)])
    assert refused.exit_code == 2
    assert "line 1: tools entry 1: unknown kind 'ssh'" in " ".join(refused.output.split())
