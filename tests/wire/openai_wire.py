"""OpenAI Chat Completions on the wire: request checks, replies, errors.

The checks are the ones the real API makes and an adapter bug would trip: every assistant
``tool_calls`` answered by ``tool`` messages, tool-call arguments as JSON strings, function names
of letters, digits, ``_`` and ``-`` only, and in strict
structured output a schema where every object lists all its properties as required, forbids
others, and uses no keyword strict mode rejects.
"""

from __future__ import annotations

import json
import re
import time
from typing import Any

from hierplan.models.base import Message, ToolCall

from .backends import Reply, WireCall, WireError, conform

_NAME = re.compile(r"[a-zA-Z0-9_-]{1,64}")
_STRICT_REJECTS = {"minLength", "maxLength", "default", "uniqueItems", "minProperties"}


def parse(body: dict[str, Any]) -> WireCall:
    """The call in a ``POST /v1/chat/completions`` body, or :class:`WireError` (400)."""
    model = body.get("model")
    raw = body.get("messages")
    if not isinstance(model, str) or not isinstance(raw, list) or not raw:
        raise WireError(400, "invalid_request_error", "'model' and 'messages' are required")
    if "max_tokens" in body and "max_completion_tokens" in body:
        raise WireError(400, "invalid_request_error", "give max_tokens or max_completion_tokens")
    messages = _messages(raw)
    schema_name = schema = None
    strict = False
    fmt = body.get("response_format")
    if fmt is not None:
        spec = fmt.get("json_schema", {}) if fmt.get("type") == "json_schema" else None
        if not spec or not isinstance(spec.get("schema"), dict) or not spec.get("name"):
            raise WireError(400, "invalid_request_error", "response_format needs a json_schema")
        schema_name, schema, strict = spec["name"], spec["schema"], bool(spec.get("strict"))
        if strict:
            check_strict(schema, schema_name)
    tools = []
    for index, tool in enumerate(body.get("tools", [])):
        function = tool.get("function", {}) if tool.get("type") == "function" else {}
        if not function.get("name") or function.get("parameters", {}).get("type") != "object":
            raise WireError(400, "invalid_request_error", f"invalid tool: {json.dumps(tool)}")
        if not _NAME.fullmatch(function["name"]):
            raise WireError(
                400,
                "invalid_request_error",
                f"Invalid 'tools[{index}].function.name': string does not match pattern. "
                "Expected a string that matches the pattern '^[a-zA-Z0-9_-]+$'.",
            )
        tools.append(function["name"])
    limit = body.get("max_completion_tokens", body.get("max_tokens"))
    return WireCall("openai", model, messages, tools, schema_name, schema, strict, limit, body)


def _messages(raw: list[dict[str, Any]]) -> list[Message]:
    out: list[Message] = []
    pending: set[str] = set()
    for m in raw:
        role = m.get("role")
        if pending and role != "tool":
            raise WireError(
                400,
                "invalid_request_error",
                "An assistant message with 'tool_calls' must be followed by tool messages "
                f"responding to each 'tool_call_id'. Missing: {sorted(pending)}",
            )
        if role in ("system", "developer", "user"):
            out.append(Message("user" if role == "user" else "system", str(m.get("content"))))
        elif role == "assistant":
            calls = []
            for c in m.get("tool_calls") or []:
                arguments = c["function"]["arguments"]
                if not isinstance(arguments, str):
                    raise WireError(400, "invalid_request_error", "arguments must be a string")
                calls.append(ToolCall(c["id"], c["function"]["name"], json.loads(arguments)))
            pending = {c.id for c in calls}
            out.append(Message("assistant", m.get("content") or "", tuple(calls)))
        elif role == "tool":
            call_id = m.get("tool_call_id")
            if call_id not in pending:
                raise WireError(400, "invalid_request_error", f"unexpected tool_call_id {call_id}")
            pending.discard(call_id)
            out.append(Message("tool", str(m.get("content")), tool_call_id=call_id))
        else:
            raise WireError(400, "invalid_request_error", f"unknown role {role!r}")
    return out


def check_strict(schema: Any, name: str, where: str = "root") -> None:
    if isinstance(schema, list):
        for i, item in enumerate(schema):
            check_strict(item, name, f"{where}[{i}]")
        return
    if not isinstance(schema, dict):
        return
    bad = _STRICT_REJECTS & set(schema)
    if bad:
        raise _schema_error(name, where, f"{sorted(bad)[0]} is not permitted")
    if schema.get("type") == "object":
        props = schema.get("properties", {})
        if schema.get("additionalProperties") is not False:
            raise _schema_error(name, where, "'additionalProperties' is required to be false")
        missing = set(props) - set(schema.get("required", []))
        if missing:
            raise _schema_error(
                name, where, f"'required' must include every key in properties: {sorted(missing)}"
            )
    for key, value in schema.items():
        if key in ("properties", "$defs"):
            for sub_name, sub in value.items():
                check_strict(sub, name, f"{where}.{sub_name}")
        elif key in ("items", "anyOf"):
            check_strict(value, name, f"{where}.{key}")


def _schema_error(name: str, where: str, what: str) -> WireError:
    return WireError(
        400,
        "invalid_request_error",
        f"Invalid schema for response_format '{name}': {where}: {what}",
    )


def completion(reply: Reply, call: WireCall, *, usage: bool = True) -> dict[str, Any]:
    """A ``chat.completion`` object for ``reply``."""
    message: dict[str, Any] = {
        "role": "assistant",
        "content": reply.text or None,
        "refusal": reply.refusal or None,
    }
    if reply.raw_output is not None:
        message["content"] = reply.raw_output
    elif reply.output is not None:
        data = conform(call.schema or {}, reply.output) if call.strict else reply.output
        message["content"] = json.dumps(data)
    if reply.tool_calls:
        message["tool_calls"] = [
            {
                "id": call_id or f"call_{i}",
                "type": "function",
                "function": {"name": name, "arguments": _arguments(reply, args)},
            }
            for i, (call_id, name, args) in enumerate(reply.tool_calls)
        ]
    finish = reply.finish or ("tool_calls" if reply.tool_calls else "stop")
    body: dict[str, Any] = {
        "id": f"chatcmpl-{time.monotonic_ns()}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": call.model,
        "choices": [{"index": 0, "message": message, "finish_reason": finish, "logprobs": None}],
    }
    if usage:
        prompt, out = reply.tokens(call)
        body["usage"] = {
            "prompt_tokens": prompt,
            "completion_tokens": out,
            "total_tokens": prompt + out,
            "prompt_tokens_details": {"cached_tokens": reply.cached_tokens},
            "completion_tokens_details": {"reasoning_tokens": reply.reasoning_tokens},
        }
    return body


def chunks(reply: Reply, call: WireCall, *, usage: bool = True) -> list[str]:
    """The ``chat.completion.chunk`` objects (as JSON) of ``reply`` streamed, as the API sends
    them with ``stream_options={"include_usage": true}``: the role, the text in pieces, the
    tool calls, the finish reason, then the usage in a chunk of its own (no choices)."""
    whole = completion(reply, call, usage=usage)
    message = whole["choices"][0]["message"]
    base = {"id": whole["id"], "object": "chat.completion.chunk", "created": whole["created"]}
    base["model"] = whole["model"]

    def chunk(delta: dict[str, Any], finish: str | None = None) -> str:
        choice = {"index": 0, "delta": delta, "finish_reason": finish, "logprobs": None}
        return json.dumps({**base, "choices": [choice]})

    out = [chunk({"role": "assistant", "content": ""})]
    text = message["content"] or ""
    out += [chunk({"content": text[i : i + 40]}) for i in range(0, len(text), 40)]
    if message["refusal"]:
        out.append(chunk({"refusal": message["refusal"]}))
    for index, tool_call in enumerate(message.get("tool_calls") or ()):
        out.append(chunk({"tool_calls": [{"index": index, **tool_call}]}))
    out.append(chunk({}, whole["choices"][0]["finish_reason"]))
    if usage:
        out.append(json.dumps({**base, "choices": [], "usage": whole["usage"]}))
    return out


def _arguments(reply: Reply, args: dict[str, Any]) -> Any:
    if reply.raw_arguments is not None:
        return reply.raw_arguments
    return args if reply.object_arguments else json.dumps(args)


def error(status: int, kind: str, message: str) -> dict[str, Any]:
    """An OpenAI error body."""
    return {"error": {"message": message, "type": kind, "param": None, "code": None}}
