"""Commands whose modules are imported when the command line names them.

Between them, the commands' modules import nearly all of hierplan and the libraries under it
(the simulator, budgets, Celery's backend, rich, networkx...): most of a second. A command
line needs one of them at most, and ``hierplan --help`` none, so :class:`LazyGroup` lists the
commands from their names and one-line help alone and builds a command (importing its module)
the first time it is looked up.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterator, Mapping, MutableMapping
from dataclasses import dataclass
from typing import Any, ClassVar

import typer
import typer.core
import typer.main


@dataclass(frozen=True, slots=True)
class LazyCommand:
    """Where a command's function is (``module:function``), and its line in the list of
    commands (its ``short_help``)."""

    target: str
    short_help: str


class _Commands(MutableMapping[str, Any]):
    """A group's commands by name: the lazy ones are built on first access, in the order given;
    a command added by name replaces a lazy one of that name."""

    def __init__(
        self, lazy: Mapping[str, LazyCommand], built: Mapping[str, Any], markup: Any
    ) -> None:
        self._lazy = dict(lazy)
        self._built: dict[str, Any] = dict(built)
        self._markup = markup

    def __getitem__(self, name: str) -> Any:
        if name not in self._built:
            self._built[name] = _build(name, self._lazy[name], self._markup)  # KeyError: none
        return self._built[name]

    def __setitem__(self, name: str, command: Any) -> None:
        self._built[name] = command

    def __delitem__(self, name: str) -> None:
        found = self._lazy.pop(name, None) is not None
        if self._built.pop(name, None) is None and not found:
            raise KeyError(name)

    def __iter__(self) -> Iterator[str]:
        yield from self._lazy
        yield from (name for name in self._built if name not in self._lazy)

    def __len__(self) -> int:
        return len(self._lazy.keys() | self._built.keys())

    def short_help(self, name: str, limit: int) -> str:
        """A command's line in the list, without building it if it is not built yet."""
        if name in self._built:
            return str(self._built[name].get_short_help_str(limit))
        return self._lazy[name].short_help


class InterruptedBeforeStart(Exception):
    """A Ctrl-C came while a command's module was being imported: nothing of the command ran.

    Raised in place of the ``KeyboardInterrupt``, which the command line's parser would take
    for one during the command (exit 130 without a word); the entry point
    (:mod:`hierplan.__main__`) reports it as an interrupt before the command started."""


def _build(name: str, lazy: LazyCommand, markup: Any) -> typer.core.TyperCommand:
    try:
        return _command(name, lazy, markup)
    except KeyboardInterrupt:  # in an import: of the command's module, or one typer needs
        raise InterruptedBeforeStart(f"interrupted while building {name}") from None


def _command(name: str, lazy: LazyCommand, markup: Any) -> typer.core.TyperCommand:
    module_name, _, function = lazy.target.partition(":")
    callback = getattr(importlib.import_module(module_name), function)
    one = typer.Typer(add_completion=False, pretty_exceptions_enable=False, rich_markup_mode=markup)
    one.command(name, short_help=lazy.short_help)(callback)
    command = typer.main.get_command(one)  # a Typer of one command is that command
    if not isinstance(command, typer.core.TyperCommand):
        raise TypeError(f"{lazy.target} did not make a command: {command!r}")
    return command


class LazyGroup(typer.core.TyperGroup):
    """A command group that imports a command's module when the command is first looked up;
    a subclass names its commands in :attr:`lazy_commands`."""

    lazy_commands: ClassVar[Mapping[str, LazyCommand]] = {}

    def __init__(self, **attrs: Any) -> None:
        super().__init__(**attrs)
        self.commands = _Commands(self.lazy_commands, self.commands, self.rich_markup_mode)

    def parse_args(self, ctx: Any, args: list[str]) -> list[str]:
        """Read the group's own options; typer imports what converts them (pydantic) then, so
        a Ctrl-C there is one before the command started, not a silent exit 130."""
        try:
            return super().parse_args(ctx, args)
        except KeyboardInterrupt:
            raise InterruptedBeforeStart("interrupted while reading the options") from None

    def list_commands(self, ctx: Any) -> list[str]:
        """The commands' names, in the order they were given."""
        return list(self.commands)

    def format_commands(self, ctx: Any, formatter: Any) -> None:
        """The list of commands in the help, from their one-line help: nothing is imported."""
        commands = self.commands
        if not isinstance(commands, _Commands):  # replaced after __init__: build them all
            super().format_commands(ctx, formatter)
            return
        names = self.list_commands(ctx)
        if names:
            limit = formatter.width - 6 - max(len(name) for name in names)
            with formatter.section("Commands"):
                formatter.write_dl([(name, commands.short_help(name, limit)) for name in names])
