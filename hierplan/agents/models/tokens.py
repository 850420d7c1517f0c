"""Token estimates from text.

hierplan does not ship a tokenizer: it estimates one token per four characters of ASCII text (the
rule of thumb OpenAI and Anthropic both publish for English) and one token per character outside
ASCII (Chinese, Cyrillic, emoji: tokenizers give such a character about a token of its own, often
more, so four to a token would reserve a quarter of what the call uses), plus a fixed overhead per
message, tool and schema for the chat framing. The estimate is used for two things: the input
side of a budget reservation before a call (a real provider's reported usage then replaces it),
and the usage the offline simulator reports, which has no provider to ask.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from hierplan.agents.models.base import ModelRequest, ModelResponse, Usage

CHARS_PER_TOKEN = 4
MESSAGE_OVERHEAD_TOKENS = 4
TOOL_OVERHEAD_TOKENS = 8


def estimate_text_tokens(text: str) -> int:
    """Tokens in ``text``: four ASCII characters to a token, and a token for each character
    outside ASCII (at least 1 for non-empty text)."""
    if text.isascii():  # O(1) in CPython: the common case costs no scan
        return (len(text) + CHARS_PER_TOKEN - 1) // CHARS_PER_TOKEN
    plain = len(text.encode("ascii", "ignore"))
    return (plain + CHARS_PER_TOKEN - 1) // CHARS_PER_TOKEN + len(text) - plain


def _schema_tokens(schema: Mapping[str, Any]) -> int:
    return estimate_text_tokens(json.dumps(schema, separators=(",", ":"), sort_keys=True))


def estimate_request_tokens(request: ModelRequest) -> int:
    """Estimated input tokens of a request: messages, tool schemas and output schema."""
    total = 0
    for message in request.messages:
        total += MESSAGE_OVERHEAD_TOKENS + estimate_text_tokens(message.content)
        for call in message.tool_calls:
            total += estimate_text_tokens(call.name) + _schema_tokens(call.arguments)
    for spec in request.tools:
        total += TOOL_OVERHEAD_TOKENS + estimate_text_tokens(spec.name + spec.description)
        total += _schema_tokens(spec.parameters)
    if request.output_schema is not None:
        total += TOOL_OVERHEAD_TOKENS + _schema_tokens(request.output_schema.schema)
    return total


def counted_usage(
    response: ModelResponse, request: ModelRequest, input_tokens: int | None = None
) -> Usage:
    """The usage ``response`` counts for, set on it and flagged where it is not what the model
    reported: a reply without usage counts at the request's worst case (``input_tokens``, its
    estimate by default, plus ``max_tokens``; flag ``no_usage``), never as free; impossible
    usage (negative counts, more cached input than input) as the nearest possible one (flag
    ``invalid_usage``)."""
    usage, flag = usage_counted(response, request, input_tokens)
    if flag is None:
        return usage
    response.usage = usage
    if flag not in response.flags:  # an adapter may have flagged it already
        response.flags.append(flag)
    return usage


def usage_counted(
    response: ModelResponse, request: ModelRequest, input_tokens: int | None = None
) -> tuple[Usage, str | None]:
    """What :func:`counted_usage` would count ``response`` for, and its flag (``no_usage``,
    ``invalid_usage`` or ``None``), without changing the response: for those who see the reply
    before the call is recorded and must count it the same way."""
    reported = response.usage
    if reported is None:
        worst = estimate_request_tokens(request) if input_tokens is None else input_tokens
        return Usage(worst, request.max_tokens), "no_usage"
    return _possible(reported)


def failed_usage(reported: Usage | None) -> tuple[Usage | None, str | None]:
    """What a failed call counts for: the usage its error reported (``None`` when it reported
    none), impossible usage as the nearest possible one with the flag ``invalid_usage``, as
    the budget settles it; so that the record and the trace never show a negative cost."""
    if reported is None:
        return None, None
    return _possible(reported)


def _possible(reported: Usage) -> tuple[Usage, str | None]:
    """``reported`` made possible, flagged ``invalid_usage`` when that changed it."""
    usage = reported.possible()
    return usage, None if usage is reported else "invalid_usage"
