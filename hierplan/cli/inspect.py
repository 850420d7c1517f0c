"""``hierplan view``, ``hierplan validate`` and ``hierplan scenarios``: look at a finished
run, check a plan file, list the built-in scenarios."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from hierplan.cli.options import fail
from hierplan.errors import HierplanError, UserInputError
from hierplan.models.provider import one_line
from hierplan.plans.plan import DEFAULT_MAX_DEPTH, DEFAULT_MAX_STEPS, load_plan, validate_plan
from hierplan.records import RunResult
from hierplan.scenarios import scenarios
from hierplan.view.html import write_html
from hierplan.view.tree import plan_tree, render_run


def view_command(
    run_json: Annotated[
        Path,
        typer.Argument(
            help="A run.json written by run, demo or batch, or the run directory holding it."
        ),
    ],
    html: Annotated[
        Path | None,
        typer.Option("--html", help="Write a self-contained HTML report to this file instead."),
    ] = None,
) -> None:
    """Show a finished run: the tree with status, tokens and cost at each node and level."""
    try:
        record = _run_record_path(run_json)
        result = RunResult.load(record)
        with _unshowable(record):
            if html is not None:
                _refuse_to_replace(html)
                path = write_html(result, html)
            else:
                shown = render_run(result)
    except HierplanError as exc:
        fail(str(exc))
    except OSError as exc:
        fail(f"cannot write {html}: {exc.strerror or exc}")
    if html is not None:
        Console().print(f"HTML report: {path}", highlight=False, markup=False, soft_wrap=True)
        return
    Console().print(shown)


def _refuse_to_replace(html: Path) -> None:
    """Refuse to write a report over a file that is not an HTML page (a run.json, say): only
    an earlier report is replaced."""
    if not html.exists():
        return
    if html.is_file():
        with html.open("rb") as page:
            start = page.read(512).lstrip(b"\xef\xbb\xbf \t\r\n").lower()
        if start.startswith((b"<!doctype html", b"<html")):
            return
    raise UserInputError(
        f"{html} exists and is not an HTML report, so --html will not replace it: give "
        "--html a new file name (an earlier report is replaced)"
    )


@contextmanager
def _unshowable(record: Path) -> Iterator[None]:
    """Say in one line that ``record`` cannot be shown when rendering it trips: a record that
    passed validation may still hold a figure of a shape this version does not know (a run's
    budget, stats and verification are free-form: a record written by another version, or
    edited by hand)."""
    try:
        yield
    except (TypeError, ValueError, KeyError, AttributeError, IndexError) as exc:
        raise UserInputError(
            f"{record} is not a run record this version of hierplan can show "
            f"({type(exc).__name__}: {one_line(str(exc))})"
        ) from None


def _run_record_path(given: Path) -> Path:
    """``given``, or the ``run.json`` in it when it is a run directory (as ``resume`` takes)."""
    if not given.is_dir():
        return given
    if not (given / "run.json").is_file():
        raise UserInputError(
            f"{given} holds no run.json: give a run directory or a run.json (a batch keeps one "
            "per goal, in goals/<id>/run.json)"
        )
    return given / "run.json"


def validate_command(
    plan_file: Annotated[Path, typer.Argument(help="A plan as YAML or JSON.")],
    tools: Annotated[
        str | None, typer.Option("--tools", help="Comma-separated allowed tools.")
    ] = None,
    max_steps: Annotated[
        int, typer.Option("--max-steps", min=1, help="Most steps the plan may have.")
    ] = DEFAULT_MAX_STEPS,
    max_depth: Annotated[
        int,
        typer.Option(
            "--max-depth",
            min=1,
            help="Deepest plan level, the plan itself being level 1 (1: no sub-goals).",
        ),
    ] = DEFAULT_MAX_DEPTH,
) -> None:
    """Check a plan file: schema, ids, dependencies, $id references, cycles, size, depth and
    tools."""
    console = Console()
    try:
        plan = load_plan(plan_file)
    except HierplanError as exc:
        fail(str(exc))
    allowed = None if tools is None else [t.strip() for t in tools.split(",") if t.strip()]
    problems = validate_plan(plan, tools=allowed, max_steps=max_steps, max_depth=max_depth)
    console.print(plan_tree(plan))
    if problems:
        for p in problems:
            console.print(f"problem: {p}", style="red", markup=False, highlight=False)
        raise typer.Exit(1)
    named = sorted(
        {s.tool for s in plan.steps if s.tool} | {t for s in plan.steps for t in s.tools or ()}
    )
    if allowed is None and named:
        # Without --tools there is nothing to check the names against: a typo would pass.
        console.print(
            f"plan is valid, but its tools were not checked ({', '.join(named)}): give the "
            "tools a run has with --tools a,b to check them",
            style="yellow",
            markup=False,
            highlight=False,
        )
        return
    console.print("plan is valid", style="green")


def scenarios_command() -> None:
    """List the built-in scenarios."""
    console = Console()
    for name, found in sorted(scenarios().items()):
        console.print(f"[bold]{name}[/]: {found.description}", highlight=False)
