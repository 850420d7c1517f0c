"""The options the commands share, each declared once: a flag means the same in ``run``,
``demo``, ``resume``, ``batch`` and ``bench``. Options that mean something else in one command
(``--concurrency`` counts executor steps in ``run`` and goals in ``batch``) are declared
there."""

from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path
from types import MappingProxyType
from typing import Annotated, Any, NoReturn

import typer
from rich.console import Console

from hierplan.budgets.budget import ALLOCATIONS, MAX_BUDGET_TOKENS
from hierplan.core.settings import MAX_RETRIES, MAX_SEED, STRATEGY_NAMES
from hierplan.review.policy import POLICY_HELP
from hierplan.simulator.profiles import PROFILES
from hierplan.tracing.setup import TRACE_HELP


def fail(message: str, code: int = 2) -> NoReturn:
    """Print ``error: message`` on stderr, as one line, and exit with ``code``."""
    Console(stderr=True).print(f"error: {message}", markup=False, highlight=False, soft_wrap=True)
    raise typer.Exit(code)


def out_directory(text: str | Path) -> Path:
    """An ``--out`` value as a path; an empty one is refused. Read as it stands, ``""`` would
    be the current directory: what an unset shell variable (``--out "$DIR"``) gives, and
    never a place to write a run's files by surprise. (A command's default comes as a path.)"""
    if isinstance(text, Path):
        return text
    if not text.strip():
        raise typer.BadParameter("is empty: give a directory (or leave --out out for the default)")
    return Path(text)


def out_option(help_text: str) -> Any:
    """The ``--out``/``-o`` option of a command that writes a directory (``help_text`` says
    which), read by :func:`out_directory`."""
    return typer.Option("--out", "-o", parser=out_directory, metavar="DIR", help=help_text)


def _usd_amount(value: float | None) -> float | None:
    """A USD amount as given, refused unless it is a number, 0 or more: a range check alone
    lets ``nan`` by, or refuses it saying it is below 0."""
    if value is not None and not (math.isfinite(value) and value >= 0):
        raise typer.BadParameter(f"give a number of USD, 0 or more (e.g. 0.5), not {value:g}")
    return value


# -- what runs, and on which model --------------------------------------------------------
ModelOpt = Annotated[
    str,
    typer.Option(
        "--model", "-m", help="sim, sim:<priced-as model>, openai:<model> or anthropic:<model>."
    ),
]
StrategyOpt = Annotated[
    str, typer.Option("--strategy", "-s", help=f"One of: {', '.join(STRATEGY_NAMES)}.")
]
SeedOpt = Annotated[
    int,
    typer.Option(
        "--seed", min=0, max=MAX_SEED, help="Seed of the simulator (runs are reproducible)."
    ),
]
MaxDepthOpt = Annotated[int, typer.Option("--max-depth", min=1, max=10, help="Deepest plan level.")]
ModelRetriesOpt = Annotated[
    int | None,
    typer.Option(
        "--model-retries", min=0, max=MAX_RETRIES, help="Retries of a failed model call (3)."
    ),
]
SetOpt = Annotated[
    list[str] | None,
    typer.Option(
        "--set",
        metavar="KEY=VALUE",
        help="A run setting without a flag of its own, e.g. executor_max_tokens=4096 (repeatable).",
    ),
]
# The run settings with a flag of their own in `hierplan run`: --set refuses them there, so
# each has one place.
SETTING_FLAGS: Mapping[str, str] = MappingProxyType(
    {
        "strategy": "--strategy",
        "max_depth": "--max-depth",
        "concurrency": "--concurrency",
        "seed": "--seed",
        "model_retries": "--model-retries",
    }
)

# -- the offline simulator -------------------------------------------------------------------
ProfileOpt = Annotated[
    str, typer.Option("--sim-profile", help=f"Simulator noise: {', '.join(PROFILES)}.")
]
# No range here: the simulator refuses a scale below 0 (or nan) in one line of its own.
LatencyOpt = Annotated[
    float, typer.Option("--sim-latency-scale", help="Scale simulated latency (0 = none).")
]

# -- a provider's model, and prices --------------------------------------------------------
BaseUrlOpt = Annotated[
    str | None,
    typer.Option(
        "--base-url",
        help="API base URL: an OpenAI-compatible server (vLLM, Ollama, llama.cpp, LiteLLM) "
        "for openai:<model>, or a gateway for anthropic:<model>.",
    ),
]
TimeoutOpt = Annotated[
    float | None,
    typer.Option("--timeout", min=0.001, help="Seconds one model call may wait (120)."),
]
PriceInOpt = Annotated[
    float | None,
    typer.Option("--price-in", min=0.0, help="USD per 1M input tokens of the model."),
]
PriceOutOpt = Annotated[
    float | None,
    typer.Option("--price-out", min=0.0, help="USD per 1M output tokens of the model."),
]

# -- budgets -----------------------------------------------------------------------------------
BudgetUsdOpt = Annotated[
    float | None,
    typer.Option("--budget-usd", callback=_usd_amount, help="Cap the run's cost in USD (exact)."),
]
BudgetTokensOpt = Annotated[
    int | None,
    typer.Option(
        "--budget-tokens",
        min=0,
        max=MAX_BUDGET_TOKENS,
        help="Cap the run's tokens (input + output).",
    ),
]
AllocationOpt = Annotated[
    str,
    typer.Option(
        "--allocation",
        help=f"Split a budget among sub-goals: {', '.join(ALLOCATIONS[:-1])} or {ALLOCATIONS[-1]}.",
    ),
]

ReservationOpt = Annotated[
    str,
    typer.Option(
        "--reservation",
        help="How a call's input is reserved under a budget: exact (the provider's own count "
        "where it can be had locally, else bound), bound (a count no tokenizer exceeds) or "
        "estimate (four characters a token: may overshoot).",
    ),
]

# -- reviewing plans ---------------------------------------------------------------------------
YesOpt = Annotated[bool, typer.Option("--yes", "-y", help="Approve every plan without asking.")]
ReviewOpt = Annotated[
    bool,
    typer.Option(
        "--review", help="Review plans here before they run: approve, edit, reject or quit."
    ),
]
PauseOpt = Annotated[
    bool,
    typer.Option(
        "--pause-for-review",
        help="Do not ask here: pause at the first plan that needs review, save it in the run "
        "directory and exit with status 3; continue with hierplan resume.",
    ),
]
PolicyOpt = Annotated[
    str,
    typer.Option(
        "--review-policy",
        help=f"Which plans are reviewed: {POLICY_HELP} (the root plan and sub-goals whose "
        "budget exceeds it).",
    ),
]

# -- tracing -----------------------------------------------------------------------------------
TraceOpt = Annotated[list[str] | None, typer.Option("--trace", metavar="TARGET", help=TRACE_HELP)]
TraceContentOpt = Annotated[
    bool,
    typer.Option(
        "--trace-content", help="Record prompts and completions in the trace (off by default)."
    ),
]

# -- toolsets ------------------------------------------------------------------------------------
ToolsOpt = Annotated[
    list[str] | None,
    typer.Option(
        "--tools",
        metavar="MODULE:ATTR",
        help="Tools from Python: a Toolset, a list of tools or one tool, as module:attribute "
        "(repeatable).",
    ),
]
McpOpt = Annotated[
    list[str] | None,
    typer.Option(
        "--mcp",
        metavar="SERVER",
        help="An MCP server's tools: a command line run over stdio, an http(s) URL, or a goal "
        "file's mcp mapping as YAML, e.g. '{url: URL, headers: {Authorization: \"Bearer "
        "${TOKEN}\"}}' (repeatable).",
    ),
]
