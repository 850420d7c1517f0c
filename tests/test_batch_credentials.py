"""The batch journal keeps its settings without the credentials of a ``--base-url``; a resume
takes the URL again and runs with it."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from hierplan.batch import BatchBudget, BatchConfig, RunOptions
from hierplan.batch.budget import GoalLedger
from hierplan.batch.core import prepare
from hierplan.batch.goals import parse_goals
from hierplan.batch.journal import Journal, url_as_journaled
from hierplan.batch.runner import run_goal
from hierplan.budgets.budget import Budget, Fixed
from hierplan.budgets.ledger import LocalLedger
from hierplan.cli import app
from hierplan.errors import ModelError, UserInputError
from hierplan.records import RunResult
from hierplan.units import usd_to_pico

SECRET_URL = "http://alice:hunter2pass@127.0.0.1:9/v1?api_key=sk-live-42&region=eu#token=t0k3n"
KEPT_URL = "http://REDACTED@127.0.0.1:9/v1?api_key=REDACTED&region=eu#token=REDACTED"


@pytest.mark.parametrize(
    ("url", "kept"),
    [
        (SECRET_URL, KEPT_URL),
        ("https://ghp_abc123@host/v1", "https://REDACTED@host/v1"),
        (
            "http://host/v1?access_token=a&X-Amz-Signature=b&sig=c&design=d",
            "http://host/v1?access_token=REDACTED&X-Amz-Signature=REDACTED&sig=REDACTED&design=d",
        ),
        ("http://localhost:8000/v1", "http://localhost:8000/v1"),
        # Not a URL that can be taken apart: its credentials go all the same.
        ("http://u:pw@[::1/v1?token=t", "http://REDACTED@[::1/v1?token=REDACTED"),
    ],
)
def test_a_url_is_journaled_without_user_info_or_secret_parameters(url: str, kept: str) -> None:
    assert url_as_journaled(url) == kept


def _config(tmp_path: Path, base_url: str | None, *, resume: bool = False) -> BatchConfig:
    goals = tmp_path / "goals.jsonl"
    if not goals.exists():
        goals.write_text('{"suite": "game24", "task": 0}\n')
    options = RunOptions(model="openai:local-model", base_url=base_url, price_in=1, price_out=2)
    budget = BatchBudget(None, usd_to_pico(1), 1)
    return BatchConfig(goals, tmp_path / "out", budget, options, resume=resume)


def test_the_journal_keeps_no_credentials_of_the_base_url_and_a_resume_takes_it_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
    batch = prepare(_config(tmp_path, SECRET_URL))
    assert batch.options.base_url == SECRET_URL  # the goals of this run use the URL given
    batch.journal.close()
    stored = tmp_path / "out" / "journal.sqlite"
    files = b"".join(p.read_bytes() for p in stored.parent.glob("journal.sqlite*"))
    for secret in (b"alice", b"hunter2pass", b"sk-live-42", b"t0k3n"):
        assert secret not in files
    journal = Journal(stored, create=False)
    assert journal.meta()["options"]["base_url"] == KEPT_URL
    journal.close()

    # A resume without the URL cannot run the goals: refused, saying what to give.
    with pytest.raises(UserInputError, match="without --base-url: its URL held credentials"):
        prepare(_config(tmp_path, None, resume=True))
    # With it (its password may have changed since), the goals run on the URL given.
    rotated = SECRET_URL.replace("hunter2pass", "n3wpass")
    resumed = prepare(_config(tmp_path, rotated, resume=True))
    assert resumed.options.base_url == rotated
    resumed.journal.close()
    # Another server is another batch's.
    with pytest.raises(UserInputError, match="with --base-url"):
        prepare(_config(tmp_path, SECRET_URL.replace("127.0.0.1:9", "127.0.0.1:10"), resume=True))


def test_a_resume_without_the_withheld_base_url_is_refused_in_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
    prepare(_config(tmp_path, SECRET_URL)).journal.close()
    goals, out = tmp_path / "goals.jsonl", tmp_path / "out"
    result = CliRunner().invoke(
        app, ["batch", str(goals), "--out", str(out), "--resume", "--model", "openai:local-model"]
    )
    assert result.exit_code == 2, result.output
    text = " ".join(result.output.split())
    assert text.startswith(f"error: cannot resume {out} without --base-url"), text
    assert "hunter2pass" not in text


@pytest.mark.anyio
async def test_a_goals_failure_is_kept_without_the_credentials_its_error_quotes(
    tmp_path: Path,
) -> None:
    """The reason a goal failed is journaled and shown: a URL with a password in the error
    (a provider client may quote the address it could not reach) loses its credentials."""
    (goal,) = parse_goals('{"goal": "Say hi", "id": "g", "model": "openai:gpt-5-mini"}\n')

    async def failing(*_: object, **__: object) -> RunResult:
        raise ModelError("cannot reach http://bob:hunter2@10.0.0.1/v1?api_key=sk-abc123def456")

    outer = LocalLedger()
    account = outer.open_now("batch", None, Fixed(None, None))
    outcome = await run_goal(
        goal, RunOptions(), GoalLedger(outer, account), Budget(), tmp_path, run_fn=failing
    )
    assert outcome.state == "failed"
    assert "hunter2" not in (outcome.reason or "") and "sk-abc123" not in (outcome.reason or "")
    assert "cannot reach http://REDACTED@10.0.0.1/v1" in (outcome.reason or "")
