"""Recorded content: prompts, completions and tool arguments in the GenAI conventions' JSON, and
the redaction of anything that looks like a credential (:func:`hierplan.redact.redact`, the one
the run records and reports use too). Used only when content is opted in, except
:func:`redact`, which also cleans error messages and event text."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import Any

from opentelemetry.util.types import AttributeValue

from hierplan.models.base import Message, ModelResponse, ToolCall
from hierplan.redact import redact


def clip(text: str, limit: int) -> str:
    """``text`` redacted and cut to ``limit`` characters, saying so when cut."""
    clean = redact(text)
    if len(clean) > limit:
        return clean[:limit] + "…[truncated]"
    return clean


def to_json(value: Any) -> str:
    """``value`` as stable JSON (sorted keys; what JSON cannot hold as its ``str``)."""
    return json.dumps(value, default=str, ensure_ascii=False, sort_keys=True)


def input_messages(
    messages: Sequence[Message], content: Callable[[str], str]
) -> dict[str, AttributeValue]:
    """``gen_ai.system_instructions`` and ``gen_ai.input.messages`` in the conventions' JSON."""
    system: list[dict[str, Any]] = []
    chat: list[dict[str, Any]] = []
    for message in messages:
        if message.role == "system":
            system.append({"type": "text", "content": message.content})
            continue
        parts: list[dict[str, Any]] = []
        if message.role == "tool":
            parts.append(
                {
                    "type": "tool_call_response",
                    "id": message.tool_call_id,
                    "response": message.content,
                }
            )
        elif message.content:
            parts.append({"type": "text", "content": message.content})
        parts.extend(_tool_call_parts(message.tool_calls))
        chat.append({"role": message.role, "parts": parts})
    out: dict[str, AttributeValue] = {"gen_ai.input.messages": content(to_json(chat))}
    if system:
        out["gen_ai.system_instructions"] = content(to_json(system))
    return out


def output_messages(response: ModelResponse, content: Callable[[str], str]) -> str:
    """``gen_ai.output.messages`` of ``response`` in the conventions' JSON."""
    parts: list[dict[str, Any]] = []
    text = response.text if response.output is None else to_json(response.output)
    if text:
        parts.append({"type": "text", "content": text})
    parts.extend(_tool_call_parts(response.tool_calls))
    message = {"role": "assistant", "parts": parts, "finish_reason": response.finish_reason}
    return content(to_json([message]))


def _tool_call_parts(calls: Sequence[ToolCall]) -> list[dict[str, Any]]:
    return [
        {"type": "tool_call", "id": c.id, "name": c.name, "arguments": dict(c.arguments)}
        for c in calls
    ]
