"""The README's Python examples run as written; its CLI tables name real options."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

import hierplan
from hierplan.cli import app

README = Path(__file__).resolve().parent.parent / "README.md"


def python_blocks() -> list[str]:
    return re.findall(r"```python\n(.*?)```", README.read_text(), re.S)


def file_blocks() -> dict[str, str]:
    """Blocks marked ```python file=NAME: files the examples use, written before they run."""
    return dict(re.findall(r"```python file=(\S+)\n(.*?)```", README.read_text(), re.S))


@pytest.mark.parametrize("index", range(len(python_blocks())))
def test_python_examples_run(index: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    for name, text in file_blocks().items():
        (tmp_path / name).write_text(text)
    code = python_blocks()[index]
    exec(compile(code, f"README.md python block {index + 1}", "exec"), {"__name__": "readme"})


def test_every_documented_option_exists() -> None:
    import typer.core
    import typer.main

    command = typer.main.get_command(app)
    assert isinstance(command, typer.core.TyperGroup)
    known = {
        opt
        for sub in [command, *command.commands.values()]
        for param in sub.params
        for opt in getattr(param, "opts", [])
    }
    documented = set(re.findall(r"`(--[a-z-]+)", README.read_text()))
    assert documented, "the README documents options"
    assert documented <= known, documented - known


def test_run_settings_table_lists_every_setting_with_its_default() -> None:
    section = README.read_text().split("### Run settings", 1)[1].split("\n### ", 1)[0]
    rows = dict(re.findall(r"^\| `([a-z_]+)` \|.*\| `([^`]*)` \|$", section, re.M))
    fields = hierplan.RunSettings.model_fields
    assert list(rows) == list(fields), "the table lists every RunSettings field, in order"
    for name, field in fields.items():
        default = field.default
        shown = f"{default:g}" if isinstance(default, float) else str(default)
        assert rows[name] == shown, f"{name}: README says {rows[name]}, the default is {shown}"
