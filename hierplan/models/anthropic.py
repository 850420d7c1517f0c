"""``anthropic:<model>``: the Anthropic Messages API through the official ``anthropic`` SDK.

- Every request is streamed. The API and its SDK refuse non-streaming requests whose
  ``max_tokens`` could take more than ten minutes to generate, and a long non-streamed reply
  sits on an idle connection that proxies drop. Streaming keeps any ``max_tokens`` usable, and
  ``timeout_s`` then bounds the wait for the next event rather than for the whole answer. The
  events are accumulated here (text deltas and tool-input JSON joined once at the end; a block
  a server sends whole in its ``content_block_start`` is taken as it is), and a stream that
  stops before ``message_stop`` is a retryable failure, never a short answer.
- Plans come back as a forced tool call: the plan schema is offered as a tool named ``plan`` and
  ``tool_choice`` requires it; its ``input`` is the plan. The API refuses thinking together
  with a forced tool, and newer models think by default, so a forced call also sends
  ``thinking: {"type": "disabled"}``. Models whose thinking cannot be turned off (Fable,
  Mythos) are only offered the tool (``force_output_tool=False``, also an option); a plan they
  write as text is read too. Input that fails validation goes through the planner's repair
  attempt.
- Executors use ``tool_use`` blocks; tool results go back as ``tool_result`` blocks (marked
  ``is_error`` when the tool failed) in one user turn. A model that thinks (by default, as newer
  ones do) gets its thinking blocks back with the turn that called the tools, as the API
  requires.
- A refusal (``stop_reason: refusal``: the API's classifiers stopped the reply, perhaps inside a
  tool call) comes back as text with the flag ``refusal`` and no calls or output: the text is
  the explanation in ``stop_details``, else what the model had written.
- Usage: Anthropic's ``input_tokens`` leaves out cache reads and writes, so input is their sum,
  ``cached_input_tokens`` the cache reads and ``cache_write_tokens`` the cache writes (of which
  ``cache_write_1h_tokens`` those kept an hour, from ``cache_creation``), which the price table
  bills above plain input, as Anthropic does; thinking tokens are reasoning tokens. A reply
  without usage has ``usage=None`` and the flag ``no_usage``.
- A request that sends tools also gets Anthropic's own tool-use system prompt, billed as input;
  :meth:`AnthropicModel.hidden_input_tokens` says how large, so that budgets reserve it.
- One attempt per request, explicit ``timeout_s``; see :mod:`hierplan.models.provider`.
"""

from __future__ import annotations

import contextlib
import json
from collections import OrderedDict
from collections.abc import AsyncGenerator, Iterator, Mapping, Sequence
from contextlib import aclosing
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

import anthropic
import httpx2

from hierplan.models.base import (
    Message,
    ModelRequest,
    ModelResponse,
    OutputSchema,
    StreamItem,
    ToolCall,
    ToolSpec,
)
from hierplan.models.provider import (
    DEFAULT_TIMEOUT_S,
    ProviderModel,
    ToolNames,
    body_message,
    context_full_error,
    loads_json,
    malformed_error,
    sent,
    status_error,
    timeout_error,
    tool_arguments,
    truncated_error,
)
from hierplan.models.tokens import anthropic_tool_prompt_tokens
from hierplan.units import Usage

API_KEY_VARIABLE = "ANTHROPIC_API_KEY"
BASE_URL_VARIABLE = "ANTHROPIC_BASE_URL"
TOOL_NAME_LIMIT = 128
"""The longest tool name the API takes."""
ALWAYS_THINKING = ("claude-fable", "claude-mythos")
"""Models whose thinking cannot be turned off, so no tool can be forced on them."""

# Error types the API may send inside a stream that started with HTTP 200.
# Read-only: shared by every run.
# The status each one stands for; a type not listed is taken for a server error (500), which is
# retried: the stream broke on the provider's side.
_STREAM_ERROR_STATUS: Mapping[str, int] = MappingProxyType(
    {
        "invalid_request_error": 400,
        "authentication_error": 401,
        "billing_error": 402,
        "permission_error": 403,
        "not_found_error": 404,
        "request_too_large": 413,
        "rate_limit_error": 429,
        "api_error": 500,
        "timeout_error": 504,
        "overloaded_error": 529,
    }
)
_STOP_REASONS: Mapping[str, str] = MappingProxyType(
    {
        "end_turn": "stop",
        "tool_use": "tool_calls",
        "max_tokens": "length",
    }
)


class AnthropicModel(ProviderModel[anthropic.AsyncAnthropic]):
    """A Claude model through the Anthropic API (or a server speaking its Messages format).

    ``api_key`` defaults to ``ANTHROPIC_API_KEY`` (a missing key fails here, before any work);
    ``base_url`` to ``ANTHROPIC_BASE_URL`` or Anthropic's API; ``timeout_s`` bounds the wait
    for each streamed event; ``priced_as`` names the price-table entry (default
    ``anthropic:<model>``); ``force_output_tool`` forces the structured-output tool (default:
    unless the model always thinks; see the module docstring). One SDK client per instance;
    :meth:`aclose` closes it.
    """

    provider_name = "anthropic"
    key_variable = API_KEY_VARIABLE
    base_url_variable = BASE_URL_VARIABLE

    def __init__(
        self,
        model_name: str,
        *,
        api_key: str | None = None,
        base_url: str | None = None,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        priced_as: str | None = None,
        force_output_tool: bool | None = None,
    ) -> None:
        key = self._setup(model_name, api_key, timeout_s, priced_as)
        self.force_output_tool = (
            not model_name.startswith(ALWAYS_THINKING)
            if force_output_tool is None
            else force_output_tool
        )
        self._client = anthropic.AsyncAnthropic(
            api_key=key, base_url=base_url, timeout=self.timeout_s, max_retries=0
        )
        self._thinking = _ThinkingBlocks()

    async def request(self, request: ModelRequest) -> ModelResponse:
        """One streamed attempt at ``request``; failures raise
        :class:`~hierplan.errors.ModelError`."""
        response: ModelResponse | None = None
        async with aclosing(self.stream(request)) as items:
            async for item in items:
                if isinstance(item, ModelResponse):
                    response = item
        assert response is not None  # a stream ends with its response, or raises
        return response

    async def stream(self, request: ModelRequest) -> AsyncGenerator[StreamItem, None]:
        """One attempt at ``request``, its text deltas passed on as the stream brings them,
        then the whole response. Closing it early closes the connection."""
        reply = _Reply()
        with self._errors(reply):
            stream = await self._client.messages.create(**self.build_params(request))
            async with stream:
                async for event in stream:
                    text = reply.add(event)
                    if text:
                        yield text
        if not reply.stopped:
            raise malformed_error(
                self._name, "the reply stream ended before message_stop", reply.usage()
            )
        yield self.to_response(reply, request)

    @contextlib.contextmanager
    def _errors(self, reply: _Reply) -> Iterator[None]:
        """The SDK's and the HTTP library's errors as :class:`~hierplan.errors.ModelError`,
        with what ``reply`` reported of its usage before it stopped."""
        try:
            yield
        except anthropic.APITimeoutError as exc:
            # Newer SDKs also wrap a timeout while the stream is read: what the reply reported
            # before it stopped still counts (none before message_start).
            raise timeout_error(
                self._name, self.timeout_s, reply.usage(), after_sending=sent(exc)
            ) from None
        except anthropic.APIConnectionError as exc:
            raise self._connection_error(exc, reply.usage()) from None
        except httpx2.TimeoutException:
            # A stream that stopped mid-way: the SDK does not wrap errors while it is read.
            raise timeout_error(self._name, self.timeout_s, reply.usage()) from None
        except httpx2.TransportError as exc:
            # Reading the stream is not wrapped by the SDK: a connection cut mid-stream
            # surfaces as the HTTP library's own error.
            raise self._connection_error(exc, reply.usage()) from None
        except anthropic.APIStatusError as exc:
            raise self._status_error(exc, reply) from None
        except (json.JSONDecodeError, ValueError) as exc:
            raise malformed_error(
                self._name, f"{type(exc).__name__}: {exc}", reply.usage()
            ) from None

    def _status_error(self, exc: anthropic.APIStatusError, reply: _Reply) -> Exception:
        message = body_message(exc.body) or exc.message
        status = exc.status_code
        if status < 400:
            # An "error" event inside a stream that began with HTTP 200.
            kind = getattr(exc, "type", None) or ""
            status = _STREAM_ERROR_STATUS.get(str(kind), 500)
        return status_error(
            self._name,
            status,
            message,
            exc.response.headers,
            usage=reply.usage(),
            body=exc.body,
            url=str(exc.request.url),
        )

    def build_params(self, request: ModelRequest) -> dict[str, Any]:
        """The keyword arguments of ``messages.create`` for ``request`` (always streamed)."""
        names = ToolNames.of(request.tools, request.messages, TOOL_NAME_LIMIT)
        system, messages = wire_messages(request.messages, self._thinking, names)
        params: dict[str, Any] = {
            "model": self.model_name,
            "max_tokens": request.max_tokens,
            "messages": messages,
            "stream": True,
        }
        if system:
            params["system"] = system
        tools = wire_tools(request.tools, names)
        if request.output_schema is not None:
            tools.append(output_tool(request.output_schema))
            if self.force_output_tool:
                params["tool_choice"] = {"type": "tool", "name": request.output_schema.name}
                params["thinking"] = {"type": "disabled"}
        if tools:
            params["tools"] = tools
        if request.temperature is not None:
            params["temperature"] = request.temperature
        return params

    def hidden_input_tokens(self, request: ModelRequest) -> int:
        """The input Anthropic adds to ``request`` on its own and bills: its tool-use system
        prompt, when tools are sent (the request's tools or the output tool), in the size for
        the ``tool_choice`` :meth:`build_params` sends (forced or auto). Budgets add it to
        their estimate of the request."""
        if not request.tools and request.output_schema is None:
            return 0
        forced = request.output_schema is not None and self.force_output_tool
        return anthropic_tool_prompt_tokens(self.model_name, forced=forced)

    def to_response(self, reply: _Reply, request: ModelRequest) -> ModelResponse:
        """A :class:`ModelResponse` from an accumulated stream."""
        usage = reply.usage()
        wanted = None if request.output_schema is None else request.output_schema.name
        output: Any = None
        answered = False
        text_parts: list[str] = []
        calls: list[ToolCall] = []
        if reply.stop_reason == "refusal":
            return self._refused(reply, usage)
        if reply.stop_reason == "model_context_window_exceeded":
            raise context_full_error(self._name, usage)
        finish = _STOP_REASONS.get(reply.stop_reason, reply.stop_reason or "stop")
        names = ToolNames.of(request.tools, request.messages, TOOL_NAME_LIMIT)
        for block in reply.blocks:
            if block.kind == "text":
                text_parts.append("".join(block.parts))
            elif block.kind == "tool_use":
                raw = block.tool_input()
                cut_at = request.max_tokens if finish == "length" else None
                if block.name == wanted:
                    output, raw_text = _json_or_text(raw)
                    if output is None and cut_at is not None:
                        # A repair attempt, asked with the same max_tokens, would be cut too.
                        raise truncated_error(self._name, cut_at, f"the {wanted}", usage)
                    if output is None:
                        text_parts.append(raw_text)
                    answered = True
                    continue
                name = names.local(block.name)
                arguments = tool_arguments(self._name, name, raw, usage, "input", cut_at=cut_at)
                calls.append(ToolCall(block.id, name, arguments))
        thinking = [t for t in (b.thinking() for b in reply.blocks) if t is not None]
        if thinking and calls:
            self._thinking.remember(calls[0].id, thinking)
        flags: list[str] = []
        if answered and not calls and finish == "tool_calls":
            finish = "stop"  # the forced output tool is the answer, not a call to make
        if finish == "length":
            flags.append("truncated")
        if usage is None:
            flags.append("no_usage")
        return ModelResponse(
            text="".join(text_parts),
            tool_calls=tuple(calls),
            output=output,
            usage=usage,
            model=f"anthropic:{reply.model or self.model_name}",
            finish_reason=finish,
            flags=flags,
        )

    def _refused(self, reply: _Reply, usage: Usage | None) -> ModelResponse:
        """A refused reply: stopped by the API's classifiers, possibly in the middle of a tool
        call, whose input is then cut. Its calls are not to be made: the text says why it
        stopped (the API's explanation, else what the model had written)."""
        written = "".join("".join(b.parts) for b in reply.blocks if b.kind == "text")
        return ModelResponse(
            text=reply.refusal or written,
            usage=usage,
            model=f"anthropic:{reply.model or self.model_name}",
            finish_reason="refusal",
            flags=["refusal"] if usage is not None else ["refusal", "no_usage"],
        )


def _json_or_text(raw: str | Mapping[str, Any]) -> tuple[Any, str]:
    """The forced tool's input as data, or ``(None, raw)`` so the planner reports the JSON
    error and asks for a repair."""
    if isinstance(raw, Mapping):
        return dict(raw), json.dumps(raw)
    try:
        return loads_json(raw), raw
    except ValueError:  # not JSON, or nested too deeply to read
        return None, raw


@dataclass(slots=True)
class _Block:
    kind: str
    id: str = ""
    name: str = ""
    parts: list[str] = field(default_factory=list)
    signature: str = ""
    data: str = ""
    input: Mapping[str, Any] | None = None

    @classmethod
    def start(cls, block: Any) -> _Block:
        """The block a ``content_block_start`` event opens, with any content it already holds:
        Anthropic's API sends it empty and the content in deltas, but a server speaking the
        format may send a block whole, as the SDK's own accumulator allows."""
        kind = str(getattr(block, "type", "") or "")
        started = cls(
            kind,
            str(getattr(block, "id", "") or ""),
            str(getattr(block, "name", "") or ""),
            data=str(getattr(block, "data", "") or ""),
        )
        # A text block's content is its "text", a thinking block's its "thinking".
        first = getattr(block, kind, None) if kind in ("text", "thinking") else None
        if isinstance(first, str) and first:
            started.parts.append(first)
        if kind == "thinking":
            started.signature = str(getattr(block, "signature", "") or "")
        given = getattr(block, "input", None)
        if kind == "tool_use" and isinstance(given, Mapping) and given:
            started.input = given
        return started

    def tool_input(self) -> str | Mapping[str, Any]:
        """A tool_use block's input: its streamed JSON text, which replaces any input the
        block started with (as in the SDK), else that input, else an empty object."""
        return "".join(self.parts) or self.input or "{}"

    def thinking(self) -> dict[str, Any] | None:
        """The block as the API wants it back, if it is (redacted) thinking."""
        if self.kind == "thinking":
            return {
                "type": "thinking",
                "thinking": "".join(self.parts),
                "signature": self.signature,
            }
        if self.kind == "redacted_thinking":
            return {"type": "redacted_thinking", "data": self.data}
        return None


@dataclass(slots=True)
class _Reply:
    """A streamed message, accumulated event by event."""

    model: str = ""
    blocks: list[_Block] = field(default_factory=list)
    stop_reason: str = ""
    refusal: str = ""
    stopped: bool = False
    input_tokens: int | None = None
    output_tokens: int | None = None
    cache_read: int = 0
    cache_write: int = 0
    cache_write_1h: int = 0
    thinking: int = 0

    def add(self, event: Any) -> str:
        """Take ``event`` in; the answer's text it adds (none but a text delta's)."""
        kind = getattr(event, "type", None)
        if kind == "message_start":
            message = getattr(event, "message", None)
            self.model = str(getattr(message, "model", "") or "")
            self._usage(getattr(message, "usage", None))
        elif kind == "content_block_start":
            self.blocks.append(_Block.start(getattr(event, "content_block", None)))
        elif kind == "content_block_delta":
            return self._delta(getattr(event, "index", -1), getattr(event, "delta", None))
        elif kind == "message_delta":
            delta = getattr(event, "delta", None)
            self.stop_reason = str(getattr(delta, "stop_reason", None) or self.stop_reason)
            self.refusal = _refusal_text(getattr(delta, "stop_details", None)) or self.refusal
            self._usage(getattr(event, "usage", None))
        elif kind == "message_stop":
            self.stopped = True
        return ""

    def _delta(self, index: Any, delta: Any) -> str:
        if not isinstance(index, int) or not 0 <= index < len(self.blocks):
            raise ValueError(f"a content delta names block {index!r}, which never started")
        kind = getattr(delta, "type", None)
        if kind == "text_delta":
            text = str(getattr(delta, "text", ""))
            self.blocks[index].parts.append(text)
            return text
        elif kind == "input_json_delta":
            self.blocks[index].parts.append(str(getattr(delta, "partial_json", "")))
        elif kind == "thinking_delta":
            self.blocks[index].parts.append(str(getattr(delta, "thinking", "")))
        elif kind == "signature_delta":
            self.blocks[index].signature = str(getattr(delta, "signature", ""))
        return ""

    def _usage(self, raw: Any) -> None:
        # message_delta counts are cumulative and optional: a present count replaces the
        # message_start one, an absent one leaves it.
        if raw is None:
            return
        for attr, target in (
            ("input_tokens", "input_tokens"),
            ("output_tokens", "output_tokens"),
            ("cache_read_input_tokens", "cache_read"),
            ("cache_creation_input_tokens", "cache_write"),
        ):
            value = getattr(raw, attr, None)
            if isinstance(value, int):
                setattr(self, target, value)
        details = getattr(raw, "output_tokens_details", None)
        thinking = getattr(details, "thinking_tokens", None)
        if isinstance(thinking, int):
            self.thinking = thinking
        # The writes by cache lifetime (message_start only): a one-hour write costs 2x the
        # input price, a five-minute one 1.25x. Without the split every write is taken for a
        # five-minute one, the API's default lifetime.
        hour = getattr(getattr(raw, "cache_creation", None), "ephemeral_1h_input_tokens", None)
        if isinstance(hour, int):
            self.cache_write_1h = hour

    def usage(self) -> Usage | None:
        """What the reply reported so far, or ``None`` without input and output counts."""
        if self.input_tokens is None or self.output_tokens is None:
            return None
        total_input = self.input_tokens + self.cache_read + self.cache_write
        return Usage(
            total_input,
            self.output_tokens,
            cached_input_tokens=self.cache_read,
            reasoning_tokens=min(self.thinking, self.output_tokens),
            cache_write_tokens=self.cache_write,
            cache_write_1h_tokens=min(self.cache_write_1h, self.cache_write),
        )


def _refusal_text(details: Any) -> str:
    """What a refusal's ``stop_details`` say: the explanation, else the policy category."""
    explanation = getattr(details, "explanation", None)
    if isinstance(explanation, str) and explanation.strip():
        return explanation.strip()
    category = getattr(details, "category", None)
    return f"refused under the {category} policy" if isinstance(category, str) else ""


class _ThinkingBlocks:
    """The thinking blocks of recent replies, by the id of the reply's first tool call.

    With thinking on, the API wants an assistant turn that called tools sent back starting with
    its thinking blocks, signatures intact. hierplan's messages carry no provider data, so the
    adapter keeps them here and puts them back when that turn is sent again.
    """

    def __init__(self, limit: int = 4096) -> None:
        self.limit = limit
        self._blocks: OrderedDict[str, list[dict[str, Any]]] = OrderedDict()

    def remember(self, call_id: str, blocks: list[dict[str, Any]]) -> None:
        self._blocks[call_id] = blocks
        while len(self._blocks) > self.limit:
            self._blocks.popitem(last=False)

    def get(self, call_id: str) -> list[dict[str, Any]]:
        return self._blocks.get(call_id, [])


def wire_messages(
    messages: Sequence[Message],
    thinking: _ThinkingBlocks | None = None,
    names: ToolNames | None = None,
) -> tuple[str, list[dict[str, Any]]]:
    """hierplan messages as Anthropic's ``system`` text and alternating ``messages``
    (``names``: tool names on the wire)."""
    system = "\n\n".join(m.content for m in messages if m.role == "system" and m.content.strip())
    out: list[dict[str, Any]] = []
    for m in messages:
        if m.role == "system":
            continue
        role = "assistant" if m.role == "assistant" else "user"
        blocks: list[dict[str, Any]] = []
        if m.role == "tool":
            block: dict[str, Any] = {
                "type": "tool_result",
                "tool_use_id": m.tool_call_id or "",
                "content": m.content,
            }
            if m.content.startswith("ERROR:"):
                block["is_error"] = True
            blocks.append(block)
        elif m.content.strip():
            # The API refuses blank text blocks, and a model may answer "\n\n" before a call.
            blocks.append({"type": "text", "text": m.content})
        if m.tool_calls and thinking is not None:
            blocks[:0] = thinking.get(m.tool_calls[0].id)
        for call in m.tool_calls:
            name = names.wire(call.name) if names else call.name
            use = {"type": "tool_use", "id": call.id, "name": name}
            blocks.append({**use, "input": dict(call.arguments)})
        if not blocks:
            continue
        # The API wants user and assistant turns to alternate: tool results (and any text
        # after them) share one user turn.
        if out and out[-1]["role"] == role:
            out[-1]["content"].extend(blocks)
        else:
            out.append({"role": role, "content": blocks})
    return system, out


def wire_tools(tools: Sequence[ToolSpec], names: ToolNames | None = None) -> list[dict[str, Any]]:
    """hierplan tool specs as Anthropic tools (``names``: tool names on the wire)."""
    return [
        {
            "name": names.wire(t.name) if names else t.name,
            "description": t.description,
            "input_schema": dict(t.parameters),
        }
        for t in tools
    ]


def output_tool(output: OutputSchema) -> dict[str, Any]:
    """The tool whose forced call carries structured output."""
    return {
        "name": output.name,
        "description": f"Give your answer: the {output.name}, as this tool's input.",
        "input_schema": dict(output.schema),
    }
