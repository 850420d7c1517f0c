"""The traced-run example program runs and leaves a trace, a run record and a report."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

from tracing_support import ran

ROOT = Path(__file__).resolve().parents[1]


def test_the_traced_run_example(tmp_path: Path) -> None:
    example = ROOT / "examples" / "traced_run.py"
    done = subprocess.run(
        [sys.executable, str(example), "jsonl=spans.jsonl"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode in (0, 1), done.stderr  # 1: the simulated run did not succeed
    assert re.match(r"(succeeded|partial|failed): cost \$\d", done.stdout), done.stdout
    spans = [json.loads(line) for line in (tmp_path / "spans.jsonl").read_text().splitlines()]
    record = json.loads((tmp_path / "runs" / "traced" / "run.json").read_text())
    agents = [s for s in spans if s["name"].startswith("invoke_agent")]
    assert len(agents) == len(ran(record["tree"])) >= 50
    assert (tmp_path / "runs" / "traced" / "report.html").read_text().startswith("<!DOCTYPE html>")
