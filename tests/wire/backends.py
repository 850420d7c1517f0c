"""What the wire server answers: a provider-neutral view of a request, and the backends.

A :class:`WireCall` is a received request with the conversation turned back into hierplan
messages; a backend maps it to a :class:`Reply`, which the format modules encode for the
provider. :class:`ScriptBackend` answers from a strict script; :class:`OracleBackend` reads the
prompt with hierplan's own parsers and answers as a scenario's oracle would, so whole
hierarchical runs can go over the wire.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from hierplan.agents.prompts import (
    PLAN_OUTPUT_NAME,
    PLANNER_SYSTEM,
    parse_plan_prompt,
    parse_step_prompt,
)
from hierplan.models.base import Message, ToolCall
from hierplan.plans.compact import render_compact
from hierplan.plans.plan import Plan
from hierplan.simulator.oracle import Oracle


class WireError(Exception):
    """A request the provider would refuse: answered with ``status`` and the message."""

    def __init__(self, status: int, kind: str, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.kind = kind
        self.message = message


@dataclass
class WireCall:
    """A request as the server understood it."""

    provider: str
    model: str
    messages: list[Message]
    tools: list[str]
    schema_name: str | None
    schema: dict[str, Any] | None
    strict: bool
    max_tokens: int | None
    body: dict[str, Any]

    @property
    def planning(self) -> bool:
        """Whether this is a planning call: the plan's structured output asked for, or the
        planner's prompt, which asks for the plan as compact lines."""
        if self.schema_name is not None:
            return self.schema_name == PLAN_OUTPUT_NAME
        return any(m.role == "system" and m.content == PLANNER_SYSTEM for m in self.messages)


def plan_reply(call: WireCall, data: Mapping[str, Any]) -> Reply:
    """A plan (its JSON data) as the model answers ``call``: structured output when the call
    asks for it, else compact lines with positional arguments for the prompt's tools."""
    if call.schema_name is not None:
        return Reply(output=dict(data))
    prompt = parse_plan_prompt(call.messages)
    params = {} if prompt is None else prompt.tool_params
    return Reply(text=render_compact(Plan.model_validate(data), params))


@dataclass
class Reply:
    """An answer before encoding: text, tool calls ``(id, name, args)`` or structured output.

    Token counts left ``None`` are estimated from the request and the answer. ``raw_output``
    replaces the encoded structured output verbatim (to send output that is not JSON), and
    ``raw_arguments`` every tool call's encoded arguments; ``object_arguments`` sends OpenAI
    tool-call arguments as a JSON object rather than a string, as some compatible servers do;
    ``refusal`` is OpenAI's refusal field, and with ``finish="refusal"`` the explanation in
    Anthropic's ``stop_details``; ``thinking`` is sent as a signed thinking block
    (Anthropic); ``whole_blocks`` streams each Anthropic content block whole in its
    ``content_block_start``, with no deltas, as some servers speaking the format do;
    ``cache_write_tokens`` (of which ``cache_write_1h_tokens`` kept an hour) are the input
    Anthropic reports written to its prompt cache.
    """

    text: str = ""
    tool_calls: list[tuple[str, str, dict[str, Any]]] = field(default_factory=list)
    output: Any = None
    raw_output: str | None = None
    raw_arguments: str | None = None
    object_arguments: bool = False
    refusal: str = ""
    thinking: str = ""
    input_tokens: int | None = None
    output_tokens: int | None = None
    cached_tokens: int = 0
    reasoning_tokens: int = 0
    cache_write_tokens: int = 0
    cache_write_1h_tokens: int = 0
    finish: str | None = None
    whole_blocks: bool = False

    def tokens(self, call: WireCall) -> tuple[int, int]:
        """Input and output tokens: given, or four characters per token."""
        sent = len(json.dumps(call.body.get("messages", []))) + len(call.body.get("system", ""))
        answer = self.text + json.dumps(self.output) + json.dumps(self.tool_calls)
        return (
            self.input_tokens if self.input_tokens is not None else max(1, sent // 4),
            self.output_tokens if self.output_tokens is not None else max(1, len(answer) // 4),
        )


class Backend(Protocol):
    """Answers a call (called from server threads, so it must be thread-safe)."""

    def answer(self, call: WireCall) -> Reply: ...


class ScriptBackend:
    """Answers from a script, in order; a call past its end is answered with an error.

    Items are replies or functions of the call. ``calls`` keeps every call received.
    """

    def __init__(self, script: Iterable[Reply | Callable[[WireCall], Reply]]) -> None:
        self.script = list(script)
        self.calls: list[WireCall] = []
        self._lock = threading.Lock()

    def answer(self, call: WireCall) -> Reply:
        with self._lock:
            self.calls.append(call)
            index = len(self.calls) - 1
        if index >= len(self.script):
            raise LookupError(f"the script has {len(self.script)} replies; call {index + 1}")
        item = self.script[index]
        return item(call) if callable(item) else item

    def assert_complete(self) -> None:
        """Fail unless every scripted reply was used."""
        assert len(self.calls) == len(self.script), (
            f"{len(self.calls)} of {len(self.script)} scripted replies used"
        )


class OracleBackend:
    """Answers hierplan's planner and executor prompts as ``oracle`` would.

    ``invalid_plans`` first plan answers are made invalid (a step without its title) unless the
    conversation is already a repair, to exercise the planner's repair attempt.
    """

    def __init__(self, oracle: Oracle, *, invalid_plans: int = 0, thinking: bool = False) -> None:
        self.oracle = oracle
        self.invalid_plans = invalid_plans
        self.thinking = thinking
        self.calls = 0
        self.repairs = 0
        self._lock = threading.Lock()

    def answer(self, call: WireCall) -> Reply:
        with self._lock:
            self.calls += 1
        if call.planning:
            return self._plan(call)
        prompt = parse_step_prompt(call.messages)
        action = None if prompt is None else self.oracle.act(prompt, transcript(call.messages))
        if prompt is None or action is None:
            return Reply(text="FAILED: this step is outside what the oracle knows")
        prefix = "toolu_" if call.provider == "anthropic" else ""
        return Reply(
            text=action.text,
            tool_calls=[(prefix + c.id, c.name, dict(c.arguments)) for c in action.tool_calls],
            thinking=f"Next: {prompt.instruction[:60]}" if self.thinking else "",
        )

    def _plan(self, call: WireCall) -> Reply:
        prompt = parse_plan_prompt(call.messages)
        plan = None if prompt is None else self.oracle.plan(prompt)
        if plan is None:
            return Reply(text="I cannot plan this goal.")
        data = plan.model_dump(mode="json", exclude_none=True)
        repairing = any(m.role == "user" and m.content.startswith("REPAIR:") for m in call.messages)
        with self._lock:
            if repairing:
                self.repairs += 1
            spoil = not repairing and self.invalid_plans > 0
            if spoil:
                self.invalid_plans -= 1
        if spoil and call.schema_name is not None:
            data["steps"][0].pop("title")
        reply = plan_reply(call, data)
        if spoil and call.schema_name is None:
            reply.text = reply.text.replace(". ", ": ", 1)  # a first line that does not read
        return reply


def transcript(messages: Sequence[Message]) -> list[tuple[ToolCall, str]]:
    """Tool calls that succeeded so far, with their results."""
    results = {m.tool_call_id: m.content for m in messages if m.role == "tool"}
    return [
        (call, results.get(call.id, ""))
        for m in messages
        for call in m.tool_calls
        if not results.get(call.id, "").startswith("ERROR:")
    ]


def conform(schema: Mapping[str, Any], value: Any, root: Mapping[str, Any] | None = None) -> Any:
    """``value`` as a model in strict mode would write it under ``schema``: every property
    present (``null`` when absent), open objects as JSON strings."""
    root = schema if root is None else root
    schema = _resolve(schema, root)
    branches = schema.get("anyOf")
    if branches:
        resolved = [_resolve(b, root) for b in branches]
        if value is None and any(b.get("type") == "null" for b in resolved):
            return None
        for branch in resolved:
            if _matches(branch, value):
                return conform(branch, value, root)
        return value
    kind = schema.get("type")
    if kind == "object" and isinstance(value, dict):
        props = schema.get("properties", {})
        return {key: conform(sub, value.get(key), root) for key, sub in props.items()}
    if kind == "array" and isinstance(value, list):
        return [conform(schema.get("items", {}), item, root) for item in value]
    if kind == "string" and isinstance(value, dict):
        return json.dumps(value)
    return value


def _resolve(schema: Mapping[str, Any], root: Mapping[str, Any]) -> Mapping[str, Any]:
    while "$ref" in schema:
        target: Any = root
        for part in str(schema["$ref"]).removeprefix("#/").split("/"):
            target = target[part]
        schema = target
    return schema


def _matches(schema: Mapping[str, Any], value: Any) -> bool:
    kind = schema.get("type")
    if kind == "string":
        return isinstance(value, str | dict)
    return {
        "object": isinstance(value, dict),
        "array": isinstance(value, list),
        "integer": isinstance(value, int) and not isinstance(value, bool),
        "number": isinstance(value, int | float) and not isinstance(value, bool),
        "boolean": isinstance(value, bool),
        "null": value is None,
    }.get(str(kind), value is not None)


class RepeatBackend:
    """Answers every call with the same reply (for benchmarks); counts the calls."""

    def __init__(self, reply: Reply | Callable[[WireCall], Reply]) -> None:
        self.reply = reply
        self.calls = 0
        self._lock = threading.Lock()

    def answer(self, call: WireCall) -> Reply:
        with self._lock:
            self.calls += 1
        return self.reply(call) if callable(self.reply) else self.reply
