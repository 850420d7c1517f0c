"""The model flags ``hierplan run`` and ``hierplan batch`` share: ``--base-url``, ``--timeout``,
``--price-in`` and ``--price-out``, defined once so both commands take them alike; and the
reading of an ``--out`` directory, which every command that writes one shares."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

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
