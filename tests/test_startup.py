"""Starting is quick: ``import hierplan`` and ``hierplan --help`` import none of the heavy
libraries or parts a run needs, and a command imports its own module only.

Each check runs in a fresh interpreter, since this process has imported everything already.
What they measure is which modules are imported, never a time (``benchmarks/startup.py``
times them).
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import typer.core
import typer.main

from hierplan.cli import COMMANDS, app

# What neither `import hierplan` nor `hierplan --help` needs, each a second or a tenth of one.
HEAVY = (
    "networkx",
    "hierplan.simulator",
    "rich",
    "celery",
    "opentelemetry.sdk",
    "matplotlib",
    "pydantic",
    "hierplan.batch",
    "hierplan.bench",
    "hierplan.runner",
)

# Runs `hierplan ARGS...` as `python -m hierplan` does, then prints the modules it imported.
RUN_THEN_LIST = """
import json, runpy, sys
sys.argv = ["hierplan", *sys.argv[1:]]
try:
    runpy.run_module("hierplan", run_name="__main__")
except SystemExit as stop:
    code = stop.code
print("\\nMODULES " + json.dumps([code, sorted(sys.modules)]))
"""


def _imported(*args: str) -> tuple[object, list[str], str]:
    """The exit status, the imported modules and the output of ``hierplan ARGS...``."""
    done = subprocess.run(
        [sys.executable, "-c", RUN_THEN_LIST, *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    shown, _, listed = done.stdout.rpartition("\nMODULES ")
    code, modules = json.loads(listed)
    return code, modules, shown


def _heavy(modules: list[str], heavy: tuple[str, ...] = HEAVY) -> list[str]:
    return [m for m in modules if any(m == h or m.startswith(h + ".") for h in heavy)]


def test_import_hierplan_imports_nothing_heavy() -> None:
    code = "import hierplan, json, sys; print(json.dumps(sorted(sys.modules)))"
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True
    )
    modules = json.loads(done.stdout)
    assert _heavy(modules) == []
    assert [m for m in modules if m.startswith("hierplan")] == ["hierplan"]


def test_import_hierplan_still_gives_every_public_name_on_use() -> None:
    code = "import hierplan, sys; hierplan.run; hierplan.Plan; print('networkx' in sys.modules)"
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True
    )
    # The plan module imports networkx on first use, to order or name a cycle, not on import.
    assert done.stdout.strip() == "False"


@pytest.mark.parametrize("args", [["--help"], []], ids=["--help", "no arguments"])
def test_the_command_list_imports_no_command(args: list[str]) -> None:
    code, modules, shown = _imported(*args)
    assert code in (0, 2)  # no arguments: the help, with click's status for a missing command
    assert _heavy(modules) == []
    # (runpy runs hierplan.__main__ as __main__.)
    assert [m for m in modules if m.startswith("hierplan")] == [
        "hierplan",
        "hierplan.cli",
        "hierplan.cli.lazy",
    ]
    listed = shown.split("Commands:\n", 1)[1].splitlines()
    assert [line.split()[0] for line in listed if line.strip()] == list(COMMANDS)
    for line, lazy in zip(listed, COMMANDS.values(), strict=False):
        assert line.split(None, 1)[1] == lazy.short_help


def test_a_commands_help_imports_that_command_only() -> None:
    code, modules, shown = _imported("validate", "--help")
    assert code == 0 and "Usage: hierplan validate" in shown
    assert "hierplan.cli.inspect" in modules
    assert _heavy(modules, ("hierplan.cli.run", "hierplan.cli.batch", "hierplan.cli.bench")) == []
    assert _heavy(modules, ("celery", "matplotlib", "hierplan.batch", "hierplan.bench")) == []


def test_version_and_a_mistyped_command_still_answer() -> None:
    code, _, shown = _imported("--version")
    assert code == 0 and shown.startswith("hierplan ")
    done = subprocess.run(
        [sys.executable, "-m", "hierplan", "valdate"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 2
    assert "Did you mean 'validate'?" in done.stderr


def test_each_command_is_the_function_named_with_the_line_listed() -> None:
    group = typer.main.get_command(app)
    assert isinstance(group, typer.core.TyperGroup)
    for name, lazy in COMMANDS.items():
        command = group.commands[name]
        module, _, function = lazy.target.partition(":")
        assert command.callback is not None
        assert (command.callback.__module__, command.callback.__name__) == (module, function)
        assert command.get_short_help_str() == lazy.short_help
        assert command.help and command.help.strip()  # its own help page: the docstring
