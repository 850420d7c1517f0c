"""The examples of the "Reviewing plans" page (docs/review.md), run as written."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from docs_support import blocks, page
from review_support import migration_dir, source_db

__all__ = ["source_db"]

PAGE = "review.md"
BIN = Path(sys.executable).parent


@pytest.fixture
def workdir(tmp_path: Path, source_db: Path) -> Path:
    for where in ("runs/mig", "runs/embedded"):
        migration_dir(source_db, tmp_path / where)
    return tmp_path


def _env() -> dict[str, str]:
    return dict(os.environ, PATH=f"{BIN}{os.pathsep}{os.environ['PATH']}", COLUMNS="120")


def test_pause_and_resume_commands(workdir: Path) -> None:
    (commands,) = blocks(page(PAGE), "sh")
    outputs: list[str] = []
    codes: list[int] = []
    for line in commands.strip().splitlines():
        done = subprocess.run(
            line, shell=True, cwd=workdir, env=_env(), capture_output=True, text=True, timeout=300
        )
        codes.append(done.returncode)
        outputs.append(done.stdout + done.stderr)
    assert codes == [3, 0, 3, 0, 0], outputs
    assert "kind: subgoal" in outputs[1] and "copy_orders" in outputs[1]  # the pending plan
    # the new plan after the rejection, with its diff (its exact counts depend on the noise
    # the simulator draws for this seed, so check the rejected layout's own steps instead)
    assert re.search(r"changes: \+\d+ -\d+ ~\d+ \(added: indexes_reference", outputs[2]), outputs[2]
    assert "verified: 14/14 tables match" in outputs[3]
    assert "alice (TICKET-42)" in outputs[4] and "rejected" in outputs[4]


def test_callback_example(workdir: Path) -> None:
    (program,) = blocks(page(PAGE), "python")
    done = subprocess.run(
        [sys.executable, "-c", program],
        cwd=workdir,
        env=_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["paused", "succeeded alice"]
