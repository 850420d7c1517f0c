"""The ``hierplan`` command's entry point: a Ctrl-C while the command line is still being
imported ends the command as an interrupt does (one line, exit 130), not in a traceback."""

from __future__ import annotations

import json
import subprocess
import sys
import tomllib
from importlib import metadata
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

# Run in a child before the entry point: a real SIGINT, sent to itself the moment the module
# ``TRIGGER`` is first looked for, so while the command line is being imported, at that
# module, whatever the machine's speed.
INTERRUPT_AT_IMPORT = """
import os, signal, sys

TRIGGER = sys.argv[1]

class InterruptAt:
    def find_spec(self, name, path=None, target=None):
        if name == TRIGGER:
            sys.meta_path.remove(self)
            os.kill(os.getpid(), signal.SIGINT)
        return None

sys.meta_path.insert(0, InterruptAt())
sys.argv = ["hierplan", "validate", "plan.yaml"]
"""
CONSOLE_SCRIPT = "from hierplan.__main__ import main\nmain()\n"  # what pip's script runs
RUN_MODULE = "import runpy\nrunpy.run_module('hierplan', run_name='__main__')\n"  # python -m


def _child(code: str, *args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", code, *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


@pytest.mark.parametrize("entry", [CONSOLE_SCRIPT, RUN_MODULE], ids=["script", "python -m"])
@pytest.mark.parametrize(
    # hierplan.cli.inspect: the module of the command named (validate), imported once named.
    "trigger",
    ["hierplan.cli", "pydantic", "rich", "hierplan.cli.inspect", "typer"],
)
def test_ctrl_c_while_the_command_is_imported_ends_in_one_line_and_130(
    entry: str, trigger: str, tmp_path: Path
) -> None:
    done = _child(INTERRUPT_AT_IMPORT + entry, trigger, cwd=tmp_path)
    assert "Traceback" not in done.stderr, done.stderr
    assert done.returncode == 130, done.stderr
    assert done.stderr.splitlines() == [
        "error: interrupted (Ctrl-C) before the command started: nothing ran"
    ]
    assert done.stdout == ""


def test_the_entry_point_imports_nothing_heavy_before_it_is_ready(tmp_path: Path) -> None:
    """The package and the entry point import no part of hierplan, nor the libraries the
    command line needs, until ``main`` runs: a Ctrl-C before then would be a traceback."""
    code = (
        "import sys, json\nimport hierplan.__main__\n"
        "print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] in "
        "('hierplan', 'pydantic', 'rich', 'typer', 'anyio', 'yaml', 'networkx', 'openai'))))"
    )
    done = _child(code, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == ["hierplan", "hierplan.__main__"]


def test_the_console_script_is_the_entry_point() -> None:
    with (ROOT / "pyproject.toml").open("rb") as handle:
        scripts = tomllib.load(handle)["project"]["scripts"]
    assert scripts == {"hierplan": "hierplan.__main__:main"}
    (installed,) = metadata.entry_points(group="console_scripts", name="hierplan")
    assert installed.value == "hierplan.__main__:main", "reinstall: pip install -e ."


def test_the_package_still_gives_every_public_name() -> None:
    """Imported when first used, each name is the object of the module that defines it."""
    import hierplan
    from hierplan.plans.plan import validate_plan
    from hierplan.runner.run import run

    assert hierplan.run is run and hierplan.validate_plan is validate_plan
    assert set(hierplan.__all__) <= set(dir(hierplan))
