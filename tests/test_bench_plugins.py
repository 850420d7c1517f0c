"""Suites and strategies from outside: the example package under examples/bench_plugin adds a
suite and a strategy through entry points, and hierplan finds, lists and runs them.

The package is installed for the test as an installer would leave it, offline: its
``*.dist-info`` (with the entry points its ``pyproject.toml`` declares) in a temporary
directory on ``sys.path``, beside its source.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tomllib
from collections.abc import Iterator
from pathlib import Path

import pytest
from typer.testing import CliRunner

from hierplan.bench.harness import load_results
from hierplan.bench.suites import get_suite, installed_suites, suite_names
from hierplan.cli import app
from hierplan.core.settings import RunSettings, strategy_names
from hierplan.errors import UserInputError
from hierplan.hierarchy.strategies import get_strategy

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "bench_plugin"


def install(site: Path, name: str, version: str, entry_points: dict[str, dict[str, str]]) -> None:
    """A distribution's metadata in ``site``, as pip leaves it (its code is found elsewhere)."""
    info = site / f"{name.replace('-', '_')}-{version}.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
    lines = []
    for group, entries in entry_points.items():
        lines.append(f"[{group}]")
        lines += [f"{key} = {value}" for key, value in entries.items()]
        lines.append("")
    (info / "entry_points.txt").write_text("\n".join(lines))


@pytest.fixture
def example_package(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    """The example package installed on ``sys.path``; yields the paths to add."""
    project = tomllib.loads((EXAMPLE / "pyproject.toml").read_text())["project"]
    site = tmp_path / "site"
    install(site, project["name"], project["version"], project["entry-points"])
    paths = [str(site), str(EXAMPLE / "src")]
    for path in reversed(paths):
        monkeypatch.syspath_prepend(path)
    yield paths
    sys.modules.pop("hierplan_example_suite", None)


def test_the_example_s_suite_and_strategy_are_installed(example_package: list[str]) -> None:
    assert suite_names()[-2:] == ("tot24", "hanoi")  # after the built-in ones
    assert "dag-once" in strategy_names()
    (hanoi,) = [s for s in installed_suites() if s.name == "hanoi"]
    assert hanoi.origin == "hierplan-example-suite 0.1.0"
    assert RunSettings(strategy="dag-once").strategy == "dag-once"
    assert get_strategy("dag-once").name == "dag-once"
    assert get_suite("hanoi").size() is None


def test_bench_list_shows_what_is_installed(example_package: list[str]) -> None:
    """In a process of its own, as a user runs it: the entry points come from sys.path."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(example_package)}
    done = subprocess.run(
        [sys.executable, "-m", "hierplan", "bench", "--list"],
        capture_output=True,
        text=True,
        env=env,
        check=False,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert any(line.startswith("  hanoi  [hierplan-example-suite 0.1.0]") for line in lines)
    assert "  dag-once  [hierplan-example-suite 0.1.0]" in lines
    for builtin in ("planbench", "tot24", "blocksworld"):
        assert any(line.startswith(f"  {builtin}  [hierplan]") for line in lines)
    assert "  react  [hierplan]" in lines


def test_the_example_suite_runs_under_its_own_and_built_in_strategies(
    example_package: list[str], tmp_path: Path
) -> None:
    out = tmp_path / "h"
    result = CliRunner().invoke(app, ["bench", "--suite", "hanoi", "--strategies",
                                      "react,dag,dag-once", "--tasks", "3", "--seeds", "1",
                                      "--sim-profile", "ideal", "--sim-latency-scale", "0",
                                      "--no-plot", "--out", str(out)])  # fmt: skip
    assert result.exit_code == 0, result.output
    records = load_results(out / "results.jsonl")
    assert {(r["strategy"], r["outcome"]) for r in records} == {
        ("react", "success"),
        ("dag", "success"),
        ("dag-once", "success"),
    }
    assert "hanoi: vs react" in " ".join(result.output.split())


def test_without_the_package_its_names_are_unknown() -> None:
    assert "hanoi" not in suite_names() and "dag-once" not in strategy_names()
    with pytest.raises(UserInputError, match="unknown suite 'hanoi'"):
        get_suite("hanoi")
    with pytest.raises(ValueError, match="unknown strategy 'dag-once'"):
        RunSettings(strategy="dag-once")


def test_a_broken_entry_point_is_named_in_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    site = tmp_path / "site"
    install(site, "broken-suites", "1.0", {
        "hierplan.suites": {"missing": "no_such_module:Suite", "odd": "json:dumps"},
        "hierplan.strategies": {"wrong": "json:dumps"},
    })  # fmt: skip
    monkeypatch.syspath_prepend(str(site))
    with pytest.raises(
        UserInputError, match=r"cannot load the hierplan\.suites entry point .missing."
    ):
        get_suite("missing")
    with pytest.raises(UserInputError, match=r"is not a hierplan\.bench\.Suite subclass"):
        get_suite("odd")
    with pytest.raises(UserInputError, match="is not a Strategy subclass"):
        get_strategy("wrong")
    result = CliRunner().invoke(app, ["bench", "--suite", "missing", "--out", str(tmp_path / "x")])
    assert result.exit_code == 2 and len(result.stderr.strip().splitlines()) == 1
    listed = CliRunner().invoke(app, ["bench", "--list"])
    assert listed.exit_code == 0 and "(cannot load:" in listed.output
