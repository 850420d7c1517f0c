"""The model flags ``hierplan run`` and ``hierplan batch`` share: ``--base-url``, ``--timeout``,
``--price-in`` and ``--price-out``, defined once so both commands take them alike; and the
reading of an ``--out`` directory, which every command that writes one shares."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any
from urllib.parse import urlsplit

import typer

from hierplan.errors import UserInputError

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

SIMULATOR_ONLY = (
    "--base-url and --timeout apply to real models (--model openai:<model> or "
    "anthropic:<model>), not to the simulator"
)
"""Why ``--base-url``/``--timeout`` are refused when only the simulator would answer."""


def check_base_url(base_url: str) -> str:
    """``base_url`` if it is an http(s) URL with a host; else a :class:`UserInputError`."""
    parts = urlsplit(base_url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise UserInputError(
            f"--base-url {base_url!r} is not a URL: give one like http://localhost:8000/v1"
        )
    return base_url


def provider_options(base_url: str | None, timeout: float | None) -> dict[str, Any]:
    """The model options (``base_url``, ``timeout_s``) ``--base-url`` and ``--timeout`` give,
    for :func:`hierplan.run`'s ``model_options``."""
    options: dict[str, Any] = {}
    if base_url is not None:
        options["base_url"] = check_base_url(base_url)
    if timeout is not None:
        options["timeout_s"] = timeout
    return options


def is_simulated(model: str) -> bool:
    """Whether the model string names the offline simulator (``sim`` or ``sim:<priced-as>``),
    by the same reading of its provider as a run (``simple:x`` is no model, not the simulator)."""
    return model.partition(":")[0].strip().lower() == "sim"


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
