"""The Python examples of README.md and of every documentation page (docs/*.md) run as written;
the options they name are real; the run settings table, the command-line reference and the API
reference list everything there is."""

from __future__ import annotations

import re
from collections.abc import Iterable
from pathlib import Path

import pytest
import typer.core
import typer.main
from docs_support import README, blocks, file_blocks, headings, label, page, pages, section

import hierplan
from hierplan.cli import app

MAX_README_LINES = 300


def python_examples() -> list[tuple[Path, int, str]]:
    """Every ```python block of every page, as (page, number on its page, code)."""
    return [
        (path, number, code)
        for path in pages()
        for number, code in enumerate(blocks(path.read_text(encoding="utf-8"), "python"), 1)
    ]


EXAMPLES = python_examples()


@pytest.mark.parametrize(
    ("path", "number", "code"),
    EXAMPLES,
    ids=[f"{label(path)}-{number}" for path, number, _ in EXAMPLES],
)
def test_python_examples_run(
    path: Path, number: int, code: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    for name, text in file_blocks(path.read_text(encoding="utf-8")).items():
        (tmp_path / name).write_text(text)
    where = f"{label(path)} python block {number}"
    exec(compile(code, where, "exec"), {"__name__": "readme"})


def test_every_page_has_its_examples_found() -> None:
    assert any(path == README for path, _, _ in EXAMPLES), "README.md has a Python example"
    assert {label(path) for path, _, _ in EXAMPLES} >= {
        "docs/library.md",
        "docs/budgets.md",
        "docs/tracing.md",
        "docs/review.md",
    }


def _group() -> typer.core.TyperGroup:
    command = typer.main.get_command(app)
    assert isinstance(command, typer.core.TyperGroup)
    return command


def _options(params: Iterable[object]) -> set[str]:
    """The option names (``--name``, ``-n``, ``--no-name``) of a command's parameters."""
    return {
        opt
        for param in params
        for opt in [*getattr(param, "opts", []), *getattr(param, "secondary_opts", [])]
        if opt.startswith("-")
    }


def test_every_documented_option_exists() -> None:
    command = _group()
    commands = [command, *command.commands.values()]
    known = {"--help"}.union(*(_options(sub.params) for sub in commands))
    for path in pages():
        documented = set(re.findall(r"`(--[a-z-]+)", path.read_text(encoding="utf-8")))
        assert documented <= known, (label(path), documented - known)
    assert re.findall(r"`(--[a-z-]+)", README.read_text()), "the README documents options"


def test_run_settings_table_lists_every_setting_with_its_default() -> None:
    found = [
        path
        for path in pages()
        if any(title == "Run settings" for _, _, title in headings(path.read_text()))
    ]
    assert len(found) == 1, f"one page has the run settings table: {[label(p) for p in found]}"
    (path,) = found
    table = section(path.read_text(), "Run settings")
    rows = dict(re.findall(r"^\| `([a-z_]+)` \|.*\| `([^`]*)` \|$", table, re.M))
    fields = hierplan.RunSettings.model_fields
    assert list(rows) == list(fields), "the table lists every RunSettings field, in order"
    for name, field in fields.items():
        default = field.default
        shown = f"{default:g}" if isinstance(default, float) else str(default)
        assert rows[name] == shown, f"{name}: the table says {rows[name]}, the default is {shown}"


def test_the_command_line_reference_has_every_command_and_option() -> None:
    text = page("cli.md")
    command = _group()
    overview = text.split("\n## ", 1)[0]
    for option in _options(command.params) | {"--help"}:
        assert re.search(rf"`{option}[` ]", overview), f"the global option {option}"
    commands = [title for _, level, title in headings(text) if level == 2]
    assert commands == [f"hierplan {name}" for name in command.commands], commands
    for name, sub in command.commands.items():
        part = section(text, f"hierplan {name}")
        missing = sorted(o for o in _options(sub.params) if not re.search(rf"`{o}[` /]", part))
        assert not missing, f"hierplan {name}: {missing}"
        for param in sub.params:
            if isinstance(param, typer.core.TyperArgument):
                assert f"`{(param.name or '').upper()}`" in part, f"hierplan {name}: {param.name}"


def test_the_api_reference_names_every_public_name_and_only_those() -> None:
    named = re.findall(r"^::: (\S+)$", page("api.md"), re.M)
    assert len(named) == len(set(named)), "each name once"
    public = {f"hierplan.{name}" for name in hierplan.__all__ if name != "__version__"}
    assert set(named) == public, (set(named) - public, public - set(named))


def test_the_readme_stays_an_overview() -> None:
    text = README.read_text(encoding="utf-8")
    assert len(text.splitlines()) <= MAX_README_LINES
    assert "make demo" in text and "make test" in text
    for link in re.findall(r"\]\((docs/[^)#]+)", text):
        assert (README.parent / link).is_file(), link
