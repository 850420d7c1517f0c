"""How many input tokens a request holds, three ways: what a budget reserves before a call.

- ``estimate``: four characters to a token (:func:`~hierplan.models.tokens.estimate_input_tokens`).
  Cheap, and close for English, but a provider may count more: a reservation by it can be
  exceeded.
- ``bound``: one token per UTF-8 byte of every text the request carries, plus a fixed framing
  per message and per tool (:func:`bound_input_tokens`). A byte-level BPE tokenizer (OpenAI's,
  Anthropic's, Llama's) never makes more tokens than bytes, so a provider cannot count more than
  this; it reserves several times what the call uses.
- ``exact``: the provider's own tokenizer where it can be run locally: tiktoken's encoding for
  OpenAI's models, with OpenAI's published per-message framing (:class:`ExactCounter`). Tool
  schemas are counted as the tokens of their JSON plus a framing per tool, which is more than
  the rendering OpenAI sends.

Input a provider adds on its own (Anthropic's tool-use system prompt, see
:func:`~hierplan.models.tokens.estimate_input_tokens`) is added in every way.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from typing import Any, Literal, Protocol

from hierplan.errors import UserInputError
from hierplan.models.base import ModelRequest, ToolSpec
from hierplan.models.tokens import estimate_input_tokens

Reservation = Literal["exact", "bound", "estimate"]
RESERVATIONS: tuple[Reservation, ...] = ("exact", "bound", "estimate")
DEFAULT_RESERVATION: Reservation = "exact"


def check_reservation(value: object) -> Reservation:
    """``value`` as a :data:`Reservation`, or a :class:`~hierplan.errors.UserInputError`
    naming the choices."""
    for choice in RESERVATIONS:
        if value == choice:
            return choice
    raise UserInputError(f"unknown reservation {value!r}: choose one of {', '.join(RESERVATIONS)}")


# Framing a provider puts around each message and each tool (role markers, separators), as
# tokens: more than OpenAI's published 3 a message and than any chat template's per-turn marks.
BOUND_MESSAGE_TOKENS = 8
BOUND_TOOL_TOKENS = 16
# OpenAI's framing: 3 tokens a message and 3 to prime the reply (OpenAI Cookbook, "How to count
# tokens with tiktoken", read 2026-12-06); a tool is counted as its JSON and this many more.
OPENAI_MESSAGE_TOKENS = 3
OPENAI_REPLY_TOKENS = 3
OPENAI_TOOL_TOKENS = 12

_log = logging.getLogger("hierplan")


class InputCounter(Protocol):
    """Counts the input tokens of a request sent to a model."""

    def __call__(self, request: ModelRequest, model: object = None) -> int:
        """The input tokens of ``request`` on ``model`` (with what its provider adds)."""
        ...


def _utf8(text: str) -> int:
    return len(text.encode("utf-8", "surrogatepass"))


def _json(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"), sort_keys=True, ensure_ascii=False)


def _hidden(request: ModelRequest, model: object) -> int:
    hidden = getattr(model, "hidden_input_tokens", None)
    return 0 if hidden is None else int(hidden(request))


def _tool_text(spec: ToolSpec) -> str:
    return spec.name + spec.description + _json(spec.parameters)


def bound_input_tokens(request: ModelRequest, model: object = None) -> int:
    """At least as many input tokens as any byte-level BPE tokenizer makes of ``request`` (see
    the module docstring)."""
    total = _hidden(request, model)
    for message in request.messages:
        total += BOUND_MESSAGE_TOKENS + _utf8(message.role) + _utf8(message.content)
        for call in message.tool_calls:
            total += _utf8(call.name) + _utf8(_json(dict(call.arguments))) + BOUND_TOOL_TOKENS
    for spec in request.tools:
        total += BOUND_TOOL_TOKENS + _utf8(_tool_text(spec))
    if request.output_schema is not None:
        total += BOUND_TOOL_TOKENS + _utf8(_json(request.output_schema.schema))
    return total


class _Encoding(Protocol):
    def encode(self, text: str, *, disallowed_special: Any = ...) -> list[int]: ...


EncodingLoader = Callable[[str], _Encoding]
"""Loads the tiktoken encoding of a model name (tiktoken downloads it on first use)."""


def tiktoken_encoding(model_name: str) -> _Encoding:
    """The tiktoken encoding OpenAI uses for ``model_name`` (``o200k_base`` for a model
    tiktoken does not know by name). Needs the ``tiktoken`` package, and a download on first use
    (tiktoken keeps it in its cache afterwards)."""
    import tiktoken

    try:
        name = tiktoken.encoding_name_for_model(model_name)
    except KeyError:
        name = "o200k_base"
    return tiktoken.get_encoding(name)


class ExactCounter:
    """OpenAI's own count of a request's input tokens, by tiktoken (see the module docstring).
    The encoding is loaded on the first count; when it cannot be (tiktoken missing, no network
    for its first download), the counter says so once and counts by the bound instead."""

    def __init__(self, model_name: str, loader: EncodingLoader = tiktoken_encoding) -> None:
        self.model_name = model_name
        self._loader = loader
        self._encoding: _Encoding | None = None
        self._failed = False

    def _load(self) -> _Encoding | None:
        if self._encoding is None and not self._failed:
            try:
                self._encoding = self._loader(self.model_name)
            except ImportError:
                self._fall_back("tiktoken is not installed: pip install 'hierplan[tiktoken]'")
            except Exception as exc:  # a failed first download, a bad cache file
                self._fall_back(f"{type(exc).__name__}: {str(exc)[:200]}")
        return self._encoding

    def _fall_back(self, why: str) -> None:
        self._failed = True
        _log.warning(
            "hierplan: the tokenizer of %s cannot be loaded (%s); budgets reserve its calls "
            "by the bound instead (one token per byte of input)",
            self.model_name,
            why,
        )

    def __call__(self, request: ModelRequest, model: object = None) -> int:
        """OpenAI's count of ``request``, or the bound when the encoding cannot be loaded."""
        encoding = self._load()
        if encoding is None:
            return bound_input_tokens(request, model)

        def count(text: str) -> int:
            return len(encoding.encode(text, disallowed_special=()))

        total = OPENAI_REPLY_TOKENS + _hidden(request, model)
        for message in request.messages:
            total += OPENAI_MESSAGE_TOKENS + count(message.role) + count(message.content)
            for call in message.tool_calls:
                total += count(call.name) + count(_json(dict(call.arguments))) + OPENAI_TOOL_TOKENS
        for spec in request.tools:
            total += OPENAI_TOOL_TOKENS + count(_tool_text(spec))
        if request.output_schema is not None:
            total += OPENAI_TOOL_TOKENS + count(_json(request.output_schema.schema))
        return total


def input_counter(
    reservation: Reservation,
    provider: str,
    model_name: str,
    *,
    custom_server: bool = False,
    loader: EncodingLoader | None = None,
) -> InputCounter:
    """How a budget counts the input of calls to a model. ``exact``: by the provider's own
    count where it is known here: tiktoken's for an ``openai`` model on OpenAI's own API (the
    bound when tiktoken cannot be loaded), the estimate for models that count their usage by it
    (the simulator and the test doubles), else (Anthropic, an OpenAI-compatible server) the
    bound.
    ``bound`` and ``estimate`` as asked."""
    if reservation == "estimate":
        return estimate_input_tokens
    if reservation == "bound":
        return bound_input_tokens
    if provider == "openai" and not custom_server:
        return ExactCounter(model_name, loader or tiktoken_encoding)
    if provider in ("openai", "anthropic"):
        return bound_input_tokens
    return estimate_input_tokens
