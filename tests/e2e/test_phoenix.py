"""End to end with a real trace backend: the demo exported over OTLP/HTTP to Arize Phoenix,
read back from Phoenix's REST API."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from e2e_support import ROOT, free_port, hierplan, ran

pytestmark = pytest.mark.e2e

PROJECT = "hierplan-e2e"
KINDS = {
    "invoke_workflow": "CHAIN",
    "invoke_agent": "AGENT",
    "plan": "CHAIN",
    "chat": "LLM",
    "execute_tool": "TOOL",
}


def _phoenix_command() -> Path:
    named = os.environ.get("HIERPLAN_PHOENIX")
    candidates = [Path(named)] if named else []
    candidates.append(ROOT / ".venv-phoenix" / "bin" / "phoenix")
    found = shutil.which("phoenix")
    if found:
        candidates.append(Path(found))
    for candidate in candidates:
        if candidate.exists():
            return candidate
    pytest.fail(
        "Arize Phoenix is not installed: run `make e2e` (it installs the phoenix extra into "
        ".venv-phoenix), or point HIERPLAN_PHOENIX at a `phoenix` executable"
    )


def _get(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=10) as response:
        return json.loads(response.read())


@pytest.fixture(scope="module")
def phoenix(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """``phoenix serve`` on loopback, its telemetry off; yields its base URL."""
    command = _phoenix_command()
    workdir = tmp_path_factory.mktemp("phoenix")
    port = free_port()
    env = {
        **os.environ,
        "PHOENIX_WORKING_DIR": str(workdir),
        "PHOENIX_HOST": "127.0.0.1",
        "PHOENIX_PORT": str(port),
        "PHOENIX_GRPC_PORT": str(free_port()),
        "PHOENIX_TELEMETRY_ENABLED": "false",
        "PHOENIX_ALLOW_EXTERNAL_RESOURCES": "false",
    }
    log = (workdir / "serve.log").open("w")
    server = subprocess.Popen(
        [str(command), "serve"], env=env, stdout=log, stderr=subprocess.STDOUT
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 180
        while True:
            if server.poll() is not None:
                pytest.fail(f"phoenix serve exited:\n{(workdir / 'serve.log').read_text()[-3000:]}")
            try:
                with urllib.request.urlopen(f"{url}/healthz", timeout=2) as response:
                    if response.status == 200:
                        break
            except OSError:
                pass
            if time.monotonic() > deadline:
                pytest.fail("phoenix serve did not answer /healthz within 180 s")
            time.sleep(0.5)
        yield url
    finally:
        server.terminate()
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()
        log.close()


def _phoenix_spans(url: str, expected: int) -> list[dict[str, Any]]:
    """Every span of the project, once Phoenix holds ``expected`` of them (ingestion is async)."""
    deadline = time.monotonic() + 60
    while True:
        spans: list[dict[str, Any]] = []
        cursor = None
        while True:
            query = f"{url}/v1/projects/{PROJECT}/spans?limit=1000"
            if cursor:
                query += f"&cursor={cursor}"
            try:
                page = _get(query)
            except urllib.error.HTTPError as exc:
                if exc.code != 404:  # the project appears with its first span
                    raise
                page = {"data": [], "next_cursor": None}
            spans.extend(page["data"])
            cursor = page.get("next_cursor")
            if not cursor:
                break
        if len(spans) >= expected or time.monotonic() > deadline:
            return spans
        time.sleep(0.5)


def test_the_demo_in_phoenix(phoenix: str, tmp_path: Path) -> None:
    spans_file = tmp_path / "spans.jsonl"
    env = {
        **os.environ,
        "OTEL_METRICS_EXPORTER": "none",  # Phoenix takes traces only
        "OTEL_RESOURCE_ATTRIBUTES": f"openinference.project.name={PROJECT}",
    }
    hierplan(
        "demo",
        "--sim-latency-scale",
        "0",
        "-o",
        str(tmp_path / "demo"),
        "--trace",
        f"otlp={phoenix}",
        "--trace",
        f"jsonl={spans_file}",
        env=env,
    )
    record = json.loads((tmp_path / "demo" / "run.json").read_text())
    sent = {s["span_id"]: s for s in map(json.loads, spans_file.read_text().splitlines())}
    stored = {s["context"]["span_id"]: s for s in _phoenix_spans(phoenix, len(sent))}
    assert set(stored) == set(sent)
    assert len({s["context"]["trace_id"] for s in stored.values()}) == 1
    for span_id, span in stored.items():
        mine = sent[span_id]
        assert span["name"] == mine["name"]
        assert span["parent_id"] == mine["parent_span_id"]
        assert span["span_kind"] == KINDS[span["name"].split()[0]], span["name"]
    (root,) = [s for s in stored.values() if s["parent_id"] is None]
    assert root["name"] == "invoke_workflow hierplan"
    by_path = {
        s["attributes"]["hierplan.node.path"]: s
        for s in stored.values()
        if s["name"].startswith("invoke_agent")
    }
    assert sorted(by_path) == sorted(ran(record["tree"]))
    for path, span in by_path.items():
        parent = stored[span["parent_id"]]
        if path == "1":
            assert parent is root
        else:
            assert parent["attributes"]["hierplan.node.path"] == path.rpartition(".")[0]
    chats = [s for s in stored.values() if s["name"].startswith("chat ")]
    assert len(chats) == record["totals"]["calls"]
    for chat in chats:
        attributes = chat["attributes"]
        # Phoenix's own token attributes, mapped from the GenAI ones
        assert attributes.get("llm.token_count.prompt") == attributes.get(
            "gen_ai.usage.input_tokens"
        )
        assert attributes.get("llm.token_count.completion") == attributes.get(
            "gen_ai.usage.output_tokens"
        )
        assert stored[chat["parent_id"]]["name"].split()[0] in ("plan", "invoke_agent")
    assert (
        sum(c["attributes"].get("llm.token_count.prompt", 0) for c in chats)
        == (record["totals"]["input_tokens"])
    )
    assert (
        sum(c["attributes"].get("llm.token_count.completion", 0) for c in chats)
        == (record["totals"]["output_tokens"])
    )
    assert sum(c["attributes"].get("llm.cost.total", 0.0) for c in chats) == pytest.approx(
        record["totals"]["cost_usd"], abs=1e-12
    )
    assert root["attributes"]["gen_ai.aggregated_usage.cost"] == pytest.approx(
        record["totals"]["cost_usd"], abs=1e-12
    )
    replans = sorted(
        e["attributes"]["hierplan.node.path"]
        for s in stored.values()
        for e in s["events"]
        if e["name"] == "hierplan.replanned"
    )
    assert replans == sorted(_replanned_paths(record["tree"]))


def _replanned_paths(tree: dict[str, Any]) -> list[str]:
    stack: list[dict[str, Any]] = [tree]
    out: list[str] = []
    while stack:
        node = stack.pop()
        stack.extend(node["children"])
        out.extend(node["path"] for v in node["plan_versions"] if v["reason"] == "replan")
    return out
