"""Credentials are not kept: not in run.json, the reports, the benchmark's files, or traces;
one redaction (hierplan.redact) for all of them."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import anyio
import pytest
from display_support import render
from typer.testing import CliRunner

import hierplan
from hierplan.cli import app
from hierplan.errors import UserInputError
from hierplan.models.base import ModelResponse
from hierplan.models.scripted import ScriptedModel, plan_response
from hierplan.runner.spec import check_base_url
from hierplan.view.html import render_html
from hierplan.view.tree import render_run

REDACTED = "[REDACTED]"
IN_URL = "REDACTED"  # a URL's stand-in keeps it a URL
OPENAI_KEY = "sk-proj-Ab3dE5gH7jK9mN1pQ3rS5tU7"
ANTHROPIC_KEY = "sk-ant-api03-Zy8xW6vU4tS2rQ0pOn"
SHORT_KEY = "sk-4f9a2c7e1b"  # shorter than the 16 characters tracing used to need
BEARER = "Bearer eyJhbGciOi.J9eyJzdWIi.Oi0xMjM0"
URL = "http://bob:hunter2@gateway.example/v1?api_key=s3cr3t&model=x"
SECRETS = ("Ab3dE5gH7jK9", "Zy8xW6vU4tS2", "4f9a2c7e1b", "eyJhbGciOi", "hunter2", "s3cr3t")


def assert_no_secret(text: str) -> None:
    found = [secret for secret in SECRETS if secret in text]
    assert not found, f"{found} kept in: {text[:2000]}"


@pytest.mark.parametrize(
    ("text", "redacted"),
    [
        (f"use {OPENAI_KEY} now", f"use {REDACTED} now"),
        (f"key={ANTHROPIC_KEY}", f"key={REDACTED}"),
        (f"openai {SHORT_KEY}.", f"openai {REDACTED}."),
        (f"Authorization: {BEARER}", f"Authorization: {REDACTED}"),
        ("AKIAABCDEFGHIJKLMNOP", REDACTED),
        (URL, f"http://{IN_URL}@gateway.example/v1?api_key={IN_URL}&model=x"),
        (
            "https://u@h.example/?access_token=abc&sig=9",
            f"https://{IN_URL}@h.example/?access_token={IN_URL}&sig={IN_URL}",
        ),
        (
            "https://h.example/cb#access_token=abc&state=1",
            f"https://h.example/cb#access_token={IN_URL}&state=1",
        ),
        ('{"password": "correct horse"}', '{"password": "correct horse"}'),  # < 8 characters
        ('{"api_key": "abcd1234efgh"}', f'{{"{REDACTED}"}}'),
        # what only looks alike stays
        ("the risk-assessment-document", "the risk-assessment-document"),
        ("task-12345678 and skip-12345678", "task-12345678 and skip-12345678"),
        (
            "http://localhost:8000/v1?model=a&key_count=",
            "http://localhost:8000/v1?model=a&key_count=",
        ),
        (
            '{"url": "http://host/v1", "mail": "a@b.example"}',
            '{"url": "http://host/v1", "mail": "a@b.example"}',
        ),
        ("add 2 and 3, then skip the tokenizer", "add 2 and 3, then skip the tokenizer"),
    ],
)
def test_redact_takes_out_credentials_and_nothing_else(text: str, redacted: str) -> None:
    from hierplan.redact import redact

    assert redact(text) == redacted
    assert redact(redacted) == redacted  # redacting twice changes nothing more


def test_redact_data_redacts_every_string_but_the_kept_fields() -> None:
    from hierplan.redact import redact, redact_data

    data = {"id": OPENAI_KEY, "goal": f"with {OPENAI_KEY}", "deep": [[[{"q": (URL, 1)}]]]}
    out = redact_data(data, keep={"id"})
    assert out == {
        "id": OPENAI_KEY,
        "goal": f"with {REDACTED}",
        "deep": [[[{"q": [redact(URL), 1]}]]],
    }
    assert data["goal"] == f"with {OPENAI_KEY}"  # the input is not changed


def test_traces_use_the_same_redaction() -> None:
    from hierplan.redact import redact
    from hierplan.tracing import content, otel

    assert otel.redact is redact
    assert_no_secret(otel.redact(f"{SHORT_KEY} {URL}"))
    assert_no_secret(content.clip(f"{ANTHROPIC_KEY} {BEARER}", 1_000))


def _run_with_secrets() -> hierplan.RunResult:
    goal = f"Call the API with {OPENAI_KEY} and {BEARER}"
    plan = {
        "goal": goal,
        "steps": [{"id": "a", "title": "A", "instruction": f"use {ANTHROPIC_KEY} at {URL}"}],
    }
    model = ScriptedModel([plan_response(plan), ModelResponse(text=f"done with {SHORT_KEY}")])
    spec = hierplan.RunSpec(goal=goal, model=model, price_in=0.1, price_out=0.3)
    return anyio.run(lambda: hierplan.run(spec))


def test_run_json_keeps_no_credential_from_a_goal_a_plan_or_an_answer(tmp_path: Path) -> None:
    result = _run_with_secrets()
    path = result.write(tmp_path / "run.json")
    text = path.read_text()
    assert_no_secret(text)
    assert REDACTED in text
    loaded = hierplan.RunResult.load(path)  # still a record that reads back
    assert loaded.goal == f"Call the API with {REDACTED} and {REDACTED}"
    assert [s.id for v in loaded.tree.plan_versions for s in v.plan.steps] == ["a"]


def test_the_reports_show_no_credential(tmp_path: Path) -> None:
    """The terminal's and the HTML report of a record holding credentials (written by a
    version of hierplan that kept them) show none."""
    result = _run_with_secrets()
    result.tree.error = f"HTTP 401 from {URL}"
    assert_no_secret(render(render_run(result), width=300))
    assert_no_secret(render_html(result))


def test_run_json_holds_a_lone_surrogate_as_a_replacement_character(tmp_path: Path) -> None:
    """A model's JSON reply may hold "\\ud800": the record is still written."""
    result = _run_with_secrets()
    result.answer = "half a pair: \ud800"
    loaded = hierplan.RunResult.load(result.write(tmp_path / "run.json"))
    assert loaded.answer == "half a pair: \ufffd"


def test_bench_keeps_no_password_of_the_base_url(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """bench.json, results.jsonl and summary.md (its command) hold the base URL redacted, and
    the same command resumes the benchmark."""
    import wire.server
    from test_bench_harness import _AnySuite
    from wire import MODELS, TEST_KEY, OracleBackend, WireServer

    monkeypatch.setenv("OPENAI_API_KEY", TEST_KEY)
    # a gateway that takes the URL's credentials (sent as basic authentication)
    monkeypatch.setattr(wire.server._Handler, "_authorized", lambda self, wire: True)
    out = tmp_path / "bench"
    with WireServer(OracleBackend(_AnySuite())) as server:
        url = server.base_url("openai").replace("http://", "http://bob:hunter2@")
        args = ["bench", "--suite", "game24", "--strategies", "react", "--tasks", "1",
                "--model", MODELS["openai"], "--base-url", url, "--sim-latency-scale", "0",
                "--no-plot", "--yes", "--save-runs", "--out", str(out)]  # fmt: skip
        first = CliRunner().invoke(app, args)
        again = CliRunner().invoke(app, [*args, "--resume"])
    assert first.exit_code == 0, first.output
    assert again.exit_code == 0, again.output
    saved = [p.relative_to(out).as_posix() for p in (out / "runs").glob("*/run.json")]
    assert len(saved) == 3  # one task, three seeds
    for name in ("bench.json", "results.jsonl", "summary.md", *saved):
        assert_no_secret((out / name).read_text())
    manifest: dict[str, Any] = json.loads((out / "bench.json").read_text())
    assert manifest["base_url"] == url.replace("bob:hunter2", IN_URL)
    assert f"--base-url http://{IN_URL}@127.0.0.1" in (out / "summary.md").read_text()


@pytest.mark.parametrize(
    "url", ["http://bob:hunter2@[x/v1", "ftp://bob:hunter2@host/v1", "http://bob:hunter2@"]
)
def test_a_bad_base_url_is_refused_without_its_credentials(url: str) -> None:
    with pytest.raises(UserInputError) as caught:
        check_base_url(url)
    assert "hunter2" not in str(caught.value)
    assert "is not a URL: give one like http://localhost:8000/v1" in str(caught.value)
