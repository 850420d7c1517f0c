"""Anthropic Messages on the wire: request checks, streamed and whole replies, errors.

The checks are the ones the real API makes and an adapter bug would trip: ``max_tokens``
required, turns alternating from a user turn, no empty or blank text blocks, tool names of letters,
digits, ``_`` and ``-`` only, every ``tool_use`` answered
by a ``tool_result`` in the next user turn, and a forced ``tool_choice`` naming an offered tool.
"""

from __future__ import annotations

import hashlib
import json
import re
import time
from typing import Any, cast

from hierplan.models.base import Message, ToolCall

from .backends import Reply, WireCall, WireError

_NAME = re.compile(r"[a-zA-Z0-9_-]{1,128}")
_STOP = {"stop": "end_turn", "tool_calls": "tool_use", "length": "max_tokens"}
THINKING_BY_DEFAULT = ("claude-sonnet-5", "claude-fable", "claude-mythos")
"""Models that think unless told not to, as the API's newer models do."""


def signature(thinking: str) -> str:
    """The signature the server puts on a thinking block (checked when it comes back)."""
    return hashlib.sha256(f"wire:{thinking}".encode()).hexdigest()[:24]


def thinks(body: dict[str, Any]) -> bool:
    """Whether the request runs with thinking on."""
    kind = body.get("thinking", {}).get("type")
    if kind is not None:
        return bool(kind != "disabled")
    return str(body.get("model", "")).startswith(THINKING_BY_DEFAULT)


def parse(body: dict[str, Any]) -> WireCall:
    """The call in a ``POST /v1/messages`` body, or :class:`WireError` (400)."""
    model = body.get("model")
    limit = body.get("max_tokens")
    raw = body.get("messages")
    if not isinstance(model, str) or not isinstance(limit, int) or not isinstance(raw, list):
        raise WireError(400, "invalid_request_error", "model, max_tokens and messages: required")
    system = body.get("system", "")
    if not isinstance(system, str):
        system = "".join(block.get("text", "") for block in system)
    messages = [Message("system", system)] if system else []
    messages += _messages(raw)
    if thinks(body):
        _check_thinking_kept(raw)
    tools = {t["name"]: t for t in body.get("tools", [])}
    for index, name in enumerate(tools):
        if not _NAME.fullmatch(name):
            raise WireError(
                400,
                "invalid_request_error",
                f"tools.{index}.custom.name: String should match pattern "
                "'^[a-zA-Z0-9_-]{1,128}$'",
            )
    for tool in tools.values():
        if tool.get("input_schema", {}).get("type") != "object":
            raise WireError(400, "invalid_request_error", f"tool {tool['name']}: bad input_schema")
    schema_name = schema = None
    choice = body.get("tool_choice")
    if choice is not None and choice.get("type") == "tool":
        if choice.get("name") not in tools:
            raise WireError(400, "invalid_request_error", "tool_choice names no offered tool")
        if body.get("thinking", {}).get("type") != "disabled":  # newer models think by default
            raise WireError(
                400,
                "invalid_request_error",
                "Thinking may not be enabled when tool_choice forces tool use.",
            )
        schema_name = choice["name"]
        schema = tools[schema_name]["input_schema"]
    elif "plan" in tools:  # offered, not forced: the model may still answer with it
        schema_name, schema = "plan", tools["plan"]["input_schema"]
    names = [n for n in tools if n != schema_name]
    return WireCall("anthropic", model, messages, names, schema_name, schema, False, limit, body)


def _messages(raw: list[dict[str, Any]]) -> list[Message]:
    out: list[Message] = []
    expected = "user"
    pending: set[str] = set()
    for turn in raw:
        role = turn.get("role")
        if role != expected:
            raise WireError(400, "invalid_request_error", "roles must alternate, user first")
        expected = "assistant" if role == "user" else "user"
        content = turn.get("content")
        blocks = cast(
            list[dict[str, Any]],
            [{"type": "text", "text": content}] if isinstance(content, str) else content,
        )
        answered = {b.get("tool_use_id") for b in blocks if b.get("type") == "tool_result"}
        if pending - answered:
            raise WireError(
                400,
                "invalid_request_error",
                f"tool_use ids were found without tool_result blocks: {sorted(pending - answered)}",
            )
        pending = set()
        text: list[str] = []
        calls: list[ToolCall] = []
        for block in blocks:
            kind = block.get("type")
            if kind == "text":
                if not block.get("text"):
                    raise WireError(400, "invalid_request_error", "text blocks must be non-empty")
                if not block["text"].strip():
                    raise WireError(
                        400,
                        "invalid_request_error",
                        "messages: text content blocks must contain non-whitespace text",
                    )
                text.append(block["text"])
            elif kind == "tool_use" and role == "assistant":
                calls.append(ToolCall(block["id"], block["name"], block["input"]))
            elif kind == "tool_result" and role == "user":
                out.append(Message("tool", _result_text(block), tool_call_id=block["tool_use_id"]))
            elif kind in ("thinking", "redacted_thinking") and role == "assistant":
                continue  # checked by _check_thinking_kept; not part of the conversation text
            else:
                raise WireError(400, "invalid_request_error", f"unexpected block {kind!r}")
        if role == "assistant":
            pending = {c.id for c in calls}
            out.append(Message("assistant", "".join(text), tuple(calls)))
        elif text:
            out.append(Message("user", "\n".join(text)))
    return out


def _check_thinking_kept(raw: list[dict[str, Any]]) -> None:
    last = next((t for t in reversed(raw) if t["role"] == "assistant"), None)
    if last is None or isinstance(last["content"], str):
        return
    blocks = last["content"]
    if not any(b.get("type") == "tool_use" for b in blocks):
        return
    first = blocks[0]
    if first.get("type") != "thinking" or first.get("signature") != signature(
        first.get("thinking", "")
    ):
        raise WireError(
            400,
            "invalid_request_error",
            "messages: Expected `thinking` or `redacted_thinking`, but found "
            f"`{first.get('type')}`. When `thinking` is enabled, a final `assistant` message "
            "must start with a thinking block (preceding the lastmost set of `tool_use` and "
            "`tool_result` blocks).",
        )


def _result_text(block: dict[str, Any]) -> str:
    content = block.get("content", "")
    if isinstance(content, str):
        return content
    return "".join(part.get("text", "") for part in content)


def _blocks(reply: Reply, call: WireCall) -> list[dict[str, Any]]:
    blocks: list[dict[str, Any]] = []
    if reply.thinking:
        blocks.append(
            {"type": "thinking", "thinking": reply.thinking, "signature": signature(reply.thinking)}
        )
    if reply.text:
        blocks.append({"type": "text", "text": reply.text})
    if reply.output is not None or reply.raw_output is not None:
        raw = reply.raw_output if reply.raw_output is not None else json.dumps(reply.output)
        if call.schema_name is None:  # no output tool offered: the model writes it as text
            blocks.append({"type": "text", "text": raw})
        else:
            blocks.append(
                {"type": "tool_use", "id": "toolu_out", "name": call.schema_name, "raw": raw}
            )
    for call_id, name, args in reply.tool_calls:
        raw = reply.raw_arguments if reply.raw_arguments is not None else json.dumps(args)
        blocks.append({"type": "tool_use", "id": call_id, "name": name, "raw": raw})
    return blocks


def _usage(reply: Reply, call: WireCall, *, output_only: bool = False) -> dict[str, Any]:
    prompt, out = reply.tokens(call)
    written, hour = reply.cache_write_tokens, reply.cache_write_1h_tokens
    fresh = prompt - reply.cached_tokens - written
    usage: dict[str, Any] = {"output_tokens": out}
    if reply.reasoning_tokens:
        usage["output_tokens_details"] = {"thinking_tokens": reply.reasoning_tokens}
    if not output_only:
        usage |= {
            "input_tokens": fresh,
            "cache_read_input_tokens": reply.cached_tokens,
            "cache_creation_input_tokens": written,
            # the writes by cache lifetime, as the API reports them
            "cache_creation": {
                "ephemeral_5m_input_tokens": written - hour,
                "ephemeral_1h_input_tokens": hour,
            },
        }
    return usage


def stop_reason(reply: Reply, call: WireCall) -> str:
    """Anthropic's stop reason for ``reply`` to ``call``."""
    if reply.finish:
        return _STOP.get(reply.finish, reply.finish)
    output_tool = reply.output is not None and call.schema_name is not None
    return "tool_use" if reply.tool_calls or output_tool else "end_turn"


def message(reply: Reply, call: WireCall, *, usage: bool = True) -> dict[str, Any]:
    """A whole (non-streamed) ``message`` object."""
    content = []
    for block in _blocks(reply, call):
        if block["type"] == "tool_use":
            raw = block.pop("raw")
            block["input"] = json.loads(raw)
        content.append(block)
    body: dict[str, Any] = {
        "id": f"msg_{time.monotonic_ns()}",
        "type": "message",
        "role": "assistant",
        "model": call.model,
        "content": content,
        "stop_reason": stop_reason(reply, call),
        "stop_sequence": None,
    }
    if usage:
        body["usage"] = _usage(reply, call)
    return body


def events(reply: Reply, call: WireCall, *, usage: bool = True) -> list[tuple[str, str]]:
    """The server-sent events of a streamed reply, as ``(event, data)`` pairs."""
    start: dict[str, Any] = {
        "id": f"msg_{time.monotonic_ns()}",
        "type": "message",
        "role": "assistant",
        "model": call.model,
        "content": [],
        "stop_reason": None,
        "stop_sequence": None,
    }
    if usage:
        start["usage"] = _usage(reply, call) | {"output_tokens": 1}
    out: list[tuple[str, Any]] = [("message_start", {"type": "message_start", "message": start})]
    out.append(("ping", {"type": "ping"}))
    for index, block in enumerate(_blocks(reply, call)):
        if reply.whole_blocks:
            head, deltas = _whole(block), []
        elif block["type"] == "text":
            head = {"type": "text", "text": ""}
            deltas = [{"type": "text_delta", "text": part} for part in _pieces(block["text"])]
        elif block["type"] == "thinking":
            head = {"type": "thinking", "thinking": "", "signature": ""}
            deltas = [
                *({"type": "thinking_delta", "thinking": p} for p in _pieces(block["thinking"])),
                {"type": "signature_delta", "signature": block["signature"]},
            ]
        else:
            head = {"type": "tool_use", "id": block["id"], "name": block["name"], "input": {}}
            deltas = [
                {"type": "input_json_delta", "partial_json": part} for part in _pieces(block["raw"])
            ]
        out.append(
            (
                "content_block_start",
                {"type": "content_block_start", "index": index, "content_block": head},
            )
        )
        for piece in deltas:
            out.append(
                (
                    "content_block_delta",
                    {"type": "content_block_delta", "index": index, "delta": piece},
                )
            )
        out.append(("content_block_stop", {"type": "content_block_stop", "index": index}))
    delta: dict[str, Any] = {
        "type": "message_delta",
        "delta": {"stop_reason": stop_reason(reply, call), "stop_sequence": None},
    }
    if reply.finish == "refusal" and reply.refusal:
        details = {"type": "refusal", "category": "cyber", "explanation": reply.refusal}
        delta["delta"]["stop_details"] = details
    if usage:
        delta["usage"] = _usage(reply, call, output_only=True)
    out.append(("message_delta", delta))
    out.append(("message_stop", {"type": "message_stop"}))
    return [(name, json.dumps(data)) for name, data in out]


def _whole(block: dict[str, Any]) -> dict[str, Any]:
    """A block as a ``content_block_start`` that holds all of it."""
    if block["type"] != "tool_use":
        return block
    return {key: value for key, value in block.items() if key != "raw"} | {
        "input": json.loads(block["raw"])
    }


def _pieces(text: str, size: int = 40) -> list[str]:
    return [text[i : i + size] for i in range(0, len(text), size)] or [""]


def error(status: int, kind: str, message: str) -> dict[str, Any]:
    """An Anthropic error body."""
    return {"type": "error", "error": {"type": kind, "message": message}}
