"""The ``hierplan`` command: run, demo, resume, view, validate, scenarios, tools, batch, worker,
bench.

Each command lives in a module of its own, imported when a command line names the command
(:mod:`hierplan.cli.lazy`); the options several share are declared once in
:mod:`hierplan.cli.options`. Bad input is one ``error:`` line and exit status 2, never a
traceback (see :mod:`hierplan.cli.running` for the other exit statuses).
"""

from __future__ import annotations

import os
import sys
from types import MappingProxyType
from typing import Annotated, Any, cast

import typer

from hierplan.cli.lazy import LazyCommand, LazyGroup

# The commands, with the function of each and its line in `hierplan --help`. A command's module
# is imported only when a command line names it: `hierplan --help` imports none of them.
COMMANDS = MappingProxyType(
    {
        "run": LazyCommand(
            "hierplan.cli.run:run_command",
            "Plan and run a goal or a scenario; write DIR/run.json.",
        ),
        "demo": LazyCommand(
            "hierplan.cli.run:demo_command",
            "Migrate the sample shop database on the offline simulator.",
        ),
        "resume": LazyCommand(
            "hierplan.cli.resume:resume_command",
            "Continue a paused run with a decision on its pending plans.",
        ),
        "view": LazyCommand(
            "hierplan.cli.inspect:view_command",
            "Show a finished run: its tree, tokens and cost.",
        ),
        "validate": LazyCommand(
            "hierplan.cli.inspect:validate_command",
            "Check a plan file: schema, dependencies, cycles, tools...",
        ),
        "scenarios": LazyCommand(
            "hierplan.cli.inspect:scenarios_command", "List the built-in scenarios."
        ),
        "tools": LazyCommand(
            "hierplan.cli.tools:tools_command",
            "List the tools of the toolsets a goal file or flags name.",
        ),
        "batch": LazyCommand(
            "hierplan.cli.batch:batch_command",
            "Run many goals under one global budget, resumably.",
        ),
        "worker": LazyCommand(
            "hierplan.cli.batch:worker_command",
            "Start a Celery worker for `hierplan batch --backend celery`.",
        ),
        "bench": LazyCommand(
            "hierplan.cli.bench:bench_command", "Compare strategies on the benchmark suites."
        ),
    }
)


class _HierplanGroup(LazyGroup):
    lazy_commands = COMMANDS


app = typer.Typer(
    name="hierplan",
    cls=_HierplanGroup,
    help="Hierarchical planner-executor agents: inspectable plans, exact budgets, traced trees.",
    add_completion=False,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    # Click's plain help: rich's boxed table drops the metavar of flags into a "<bool>" column
    # and, at 80 columns, cuts option help short with an ellipsis.
    rich_markup_mode=None,
)


def _print_version(value: bool) -> None:
    if value:
        from hierplan import __version__  # read from the installed metadata: only when asked

        typer.echo(f"hierplan {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: Annotated[
        bool,
        typer.Option(
            "--version",
            callback=_print_version,
            is_eager=True,
            help="Print hierplan's version and exit.",
        ),
    ] = False,
) -> None:
    """Hierarchical planner-executor agents: inspectable plans, exact budgets, traced trees."""


# The parser's error for a command line it refuses: click's UsageError, which newer typer
# versions vendor; BadParameter derives from it in either.
_USAGE_ERROR = cast("type[Exception]", typer.BadParameter.__mro__[1])


def main() -> None:
    """Entry point of the ``hierplan`` script.

    A command line the parser refuses (an unknown option, a value out of range, a missing
    argument) is one ``error:`` line naming the help to read, like every other bad input.
    """
    # A toolset named as module:attribute is looked for in the current directory too, as
    # `python -m` would find it (the script's own directory is first on sys.path otherwise).
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        code = app(standalone_mode=False)
    except _USAGE_ERROR as exc:
        error: Any = exc
        if type(exc).__name__ == "NoArgsIsHelpError":
            # The help, as asked for by giving nothing: on stdout, as --help prints it (click's
            # plain formatter would print it to stderr, as an error).
            typer.echo(error.ctx.get_help())
            sys.exit(error.exit_code)
        from hierplan.cli.options import fail  # a command's options: imported on a refusal only

        where = error.ctx.command_path if error.ctx is not None else "hierplan"
        message = " ".join(error.format_message().split())
        try:
            fail(f"{message} (see {where} --help)", error.exit_code)
        except typer.Exit as stop:
            sys.exit(stop.exit_code)
    except typer.Abort:
        sys.exit(1)
    sys.exit(code if isinstance(code, int) else 0)
