"""A budget that cannot pay for a run's first call: refused before any call, naming the
smallest budget that starts the run; that budget does start it."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

from hierplan.cli import app

SMALLEST = re.compile(r"The smallest budget that starts this run is \$([\d.]+):")


def _run(out: Path, strategy: str, *budget: str) -> tuple[int, str]:
    args = ["run", "--scenario", "data_migration", "--strategy", strategy, "--yes"]
    args += ["--sim-latency-scale", "0", "-o", str(out), *budget]
    result = CliRunner().invoke(app, args)
    return result.exit_code, " ".join(result.output.split())


@pytest.mark.parametrize("strategy", ["hierarchical", "react", "as-needed"])
def test_a_budget_below_the_first_call_exits_2_naming_the_smallest_that_starts(
    tmp_path: Path, strategy: str
) -> None:
    code, text = _run(tmp_path / "small", strategy, "--budget-usd", "0.0001")
    assert code == 2, text
    assert "error: the run's budget cannot pay for its first call" in text
    assert "the call was not made" in text and "Traceback" not in text
    assert not (tmp_path / "small" / "run.json").exists()
    found = SMALLEST.search(text)
    assert found is not None, text
    usd = found.group(1)
    # The budget named starts the run: its first call is made, and nothing is refused as
    # too small any more.
    code, text = _run(tmp_path / "named", strategy, "--budget-usd", usd)
    assert "cannot pay for its first call" not in text, text
    record = json.loads((tmp_path / "named" / "run.json").read_text())
    assert record["budget"]["spent"]["usd"] > 0
    assert record["budget"]["spent"]["usd"] <= float(usd)


def test_a_tokens_budget_names_tokens(tmp_path: Path) -> None:
    code, text = _run(tmp_path / "t", "hierarchical", "--budget-tokens", "100")
    assert code == 2, text
    # A tokens-only budget is told about tokens, not USD.
    assert SMALLEST.search(text) is None
    assert re.search(r"needs at least [\d,]+ tokens \(max_tokens", text), text
    assert re.search(r"The smallest budget that starts this run is [\d,]+ tokens:", text), text
