"""The ``hierplan`` command: run, demo, resume, view, validate, scenarios, tools, batch, worker,
bench.

Each command lives in a module of its own; the options several share are declared once in
:mod:`hierplan.cli.options`. Bad input is one ``error:`` line and exit status 2, never a
traceback (see :mod:`hierplan.cli.running` for the other exit statuses).
"""

from __future__ import annotations

import os
import sys
from typing import Annotated, Any, cast

import typer

from hierplan import __version__
from hierplan.cli.batch import register as register_batch_commands
from hierplan.cli.bench import bench_command
from hierplan.cli.inspect import scenarios_command, validate_command, view_command
from hierplan.cli.options import fail
from hierplan.cli.resume import resume_command
from hierplan.cli.run import demo_command, run_command
from hierplan.cli.tools import tools_command

app = typer.Typer(
    name="hierplan",
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


app.command("run")(run_command)
app.command("demo")(demo_command)
app.command("resume")(resume_command)
app.command("view")(view_command)
app.command("validate")(validate_command)
app.command("scenarios")(scenarios_command)
app.command("tools")(tools_command)
register_batch_commands(app)
app.command("bench")(bench_command)


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
        where = error.ctx.command_path if error.ctx is not None else "hierplan"
        message = " ".join(error.format_message().split())
        try:
            fail(f"{message} (see {where} --help)", error.exit_code)
        except typer.Exit as stop:
            sys.exit(stop.exit_code)
    except typer.Abort:
        sys.exit(1)
    sys.exit(code if isinstance(code, int) else 0)
