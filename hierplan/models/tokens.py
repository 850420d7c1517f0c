"""Token estimates from text.

hierplan does not ship a tokenizer: it estimates one token per four characters of ASCII text (the
rule of thumb OpenAI and Anthropic both publish for English) and one token per character outside
ASCII (Chinese, Cyrillic, emoji: tokenizers give such a character about a token of its own, often
more, so four to a token would reserve a quarter of what the call uses), plus a fixed overhead per
message, tool and schema for the chat framing. The estimate is used for two things: the input
side of a budget reservation before a call (a real provider's reported usage then replaces it),
and the usage the offline simulator reports, which has no provider to ask. Input a provider adds
on its own (Anthropic's tool-use system prompt) is added to a reservation's estimate by
:func:`estimate_input_tokens`, never to the simulator's counts.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

from hierplan.models.base import ModelRequest, OutputSchema, ToolSpec

CHARS_PER_TOKEN = 4
MESSAGE_OVERHEAD_TOKENS = 4
TOOL_OVERHEAD_TOKENS = 8

# Anthropic puts a tool-use system prompt of its own in front of every request that sends tools,
# and bills it as input: by model, one size with tool_choice auto or none (the default) and one
# with any or a named tool (a forced call). Source: "Tool use pricing" in
# https://platform.claude.com/docs/en/about-claude/pricing, read 2026-12-03 (the Claude 3 rows
# checked against https://docs.anthropic.com/en/docs/tool-use-pricing-and-tokens, the 346/313
# row against https://claudecodeguides.com/claude-tool-use-hidden-token-costs-explained/).
# Models listed apart are matched by name prefix; every other model (Claude 3.7, 4, 4.x, 5 and
# any newer) takes the 346/313 row, the one current models share.
ANTHROPIC_TOOL_PROMPT_TOKENS: tuple[int, int] = (346, 313)
"""(tool_choice auto/none, any/tool) tokens for the models the table does not list apart."""
_ANTHROPIC_OLDER_TOOL_PROMPT_TOKENS: Mapping[str, tuple[int, int]] = MappingProxyType(
    {
        "claude-3-5-haiku": (264, 340),
        "claude-3-haiku": (264, 340),
        "claude-3-opus": (530, 281),
        "claude-3-sonnet": (159, 235),
    }
)


def estimate_text_tokens(text: str) -> int:
    """Tokens in ``text``: four ASCII characters to a token, and a token for each character
    outside ASCII (at least 1 for non-empty text)."""
    if text.isascii():  # O(1) in CPython: the common case costs no scan
        return (len(text) + CHARS_PER_TOKEN - 1) // CHARS_PER_TOKEN
    plain = len(text.encode("ascii", "ignore"))
    return (plain + CHARS_PER_TOKEN - 1) // CHARS_PER_TOKEN + len(text) - plain


def _schema_tokens(schema: Mapping[str, Any]) -> int:
    return estimate_text_tokens(json.dumps(schema, separators=(",", ":"), sort_keys=True))


def _spec_tokens(spec: ToolSpec | OutputSchema) -> int:
    """The estimate of a tool spec or an output schema, worked out once per object and kept on
    it (``tokens_estimate``). A run sends the same spec objects with every call (a toolbox hands
    out one tuple per allowlist), and writing each schema out as JSON to count it cost more than
    the rest of a step's orchestration (about 90 µs a call with ten tools). Kept on the object,
    the estimate goes when the spec does: nothing outside a run holds its specs. A spec's schema
    is read once: specs are frozen, and their schemas are not to be changed in place."""
    found = spec.tokens_estimate
    if found is not None:
        return found
    if isinstance(spec, ToolSpec):
        text = estimate_text_tokens(spec.name + spec.description)
        tokens = TOOL_OVERHEAD_TOKENS + text + _schema_tokens(spec.parameters)
    else:
        tokens = TOOL_OVERHEAD_TOKENS + _schema_tokens(spec.schema)
    # A memo of a pure function of a frozen object, stored in its own slot.
    object.__setattr__(spec, "tokens_estimate", tokens)
    return tokens


def estimate_request_tokens(request: ModelRequest) -> int:
    """Estimated input tokens of a request: messages, tool schemas and output schema."""
    total = 0
    for message in request.messages:
        total += MESSAGE_OVERHEAD_TOKENS + estimate_text_tokens(message.content)
        for call in message.tool_calls:
            total += estimate_text_tokens(call.name) + _schema_tokens(call.arguments)
    for spec in request.tools:
        total += _spec_tokens(spec)
    if request.output_schema is not None:
        total += _spec_tokens(request.output_schema)
    return total


def anthropic_tool_prompt_tokens(model_name: str, *, forced: bool) -> int:
    """The tokens of the tool-use system prompt Anthropic adds to a request to ``model_name``
    (``claude-haiku-4-5``) that sends tools: with a forced tool (``tool_choice`` any or tool)
    when ``forced``, else with ``tool_choice`` auto."""
    sizes = next(
        (v for k, v in _ANTHROPIC_OLDER_TOOL_PROMPT_TOKENS.items() if model_name.startswith(k)),
        ANTHROPIC_TOOL_PROMPT_TOKENS,
    )
    return sizes[1] if forced else sizes[0]


def estimate_input_tokens(request: ModelRequest, model: object = None) -> int:
    """Estimated input tokens of ``request`` sent to ``model``: :func:`estimate_request_tokens`
    plus what the model's provider adds on its own, when the model says how much through a
    ``hidden_input_tokens(request)`` method (the Anthropic adapter: its tool-use system
    prompt). Budgets reserve this; without it a call with tools overran its reservation."""
    total = estimate_request_tokens(request)
    hidden = getattr(model, "hidden_input_tokens", None)
    if hidden is not None:
        total += int(hidden(request))
    return total
