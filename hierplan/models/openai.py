"""``openai:<model>``: the OpenAI Chat Completions API through the official ``openai`` SDK.

It also serves any OpenAI-compatible server (vLLM, Ollama, llama.cpp's server, a LiteLLM proxy)
through ``base_url`` or ``OPENAI_BASE_URL``.

- Plans come back as structured output: ``response_format`` with the plan's JSON schema in strict
  mode, rewritten by :mod:`hierplan.models.schema` (strict mode wants every property
  required and no open objects). Output that still fails validation goes through the planner's
  repair attempt like any other bad plan.
- Executors call tools with ``tools`` / ``tool_calls`` and answer tool results with ``tool``
  messages.
- A refusal is text with the flag ``refusal``; a reply the content filter stopped has the flag
  ``content_filter`` and no tool calls (the filter may have cut one).
- Usage maps to :class:`Usage` with cached input (``prompt_tokens_details.cached_tokens``) and
  reasoning tokens (``completion_tokens_details.reasoning_tokens``); a reply without usage has
  ``usage=None`` and the flag ``no_usage``.
- One attempt per request: the SDK's retries are off and ``timeout_s`` is explicit (the SDK's
  default is 600 s with two silent retries). See :mod:`hierplan.models.provider`.
- ``max_completion_tokens`` is sent to OpenAI's own API; a custom ``base_url`` gets the older
  ``max_tokens``, which every compatible server understands (``max_tokens_field`` overrides).
  A server that refuses the field it got (a gateway in front of OpenAI's reasoning models
  refuses ``max_tokens``) fails that attempt retryably, and later attempts send the other one.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import AsyncGenerator, Iterator, Mapping, Sequence
from types import MappingProxyType, SimpleNamespace
from typing import Any, Literal
from urllib.parse import urlsplit

import openai

from hierplan.errors import ModelError, ModelNotAvailableError
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
    loads_json,
    malformed_error,
    sent,
    status_error,
    timeout_error,
    tool_arguments,
    truncated_error,
)
from hierplan.models.schema import Decoder, strict_decoder, strict_schema
from hierplan.units import Usage

API_KEY_VARIABLE = "OPENAI_API_KEY"
BASE_URL_VARIABLE = "OPENAI_BASE_URL"

TokenField = Literal["max_completion_tokens", "max_tokens"]
TOOL_NAME_LIMIT = 64
"""The longest function name the API takes."""
_OTHER_FIELD: Mapping[TokenField, TokenField] = MappingProxyType(
    {"max_tokens": "max_completion_tokens", "max_completion_tokens": "max_tokens"}
)


class OpenAIModel(ProviderModel[openai.AsyncOpenAI]):
    """A model served by the OpenAI API or an OpenAI-compatible server.

    ``api_key`` defaults to ``OPENAI_API_KEY`` (a missing key fails here, before any work);
    ``base_url`` to ``OPENAI_BASE_URL`` or OpenAI's API; ``timeout_s`` bounds one attempt;
    ``priced_as`` names the price-table entry (default ``openai:<model>``). One SDK client per
    instance; :meth:`aclose` closes it.

    >>> model = OpenAIModel("gpt-5-mini", api_key="sk-test")  # doctest: +SKIP
    """

    provider_name = "openai"
    key_variable = API_KEY_VARIABLE
    base_url_variable = BASE_URL_VARIABLE

    def __init__(
        self,
        model_name: str,
        *,
        api_key: str | None = None,
        base_url: str | None = None,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        organization: str | None = None,
        priced_as: str | None = None,
        max_tokens_field: TokenField | None = None,
        strict_output: bool = True,
    ) -> None:
        key = self._setup(model_name, api_key, timeout_s, priced_as)
        if max_tokens_field is not None and max_tokens_field not in _OTHER_FIELD:
            # Sent as it is, a misspelt field would be ignored or refused by the server.
            raise ModelNotAvailableError(
                f"{self._name}: max_tokens_field must be 'max_completion_tokens' or "
                f"'max_tokens', not {max_tokens_field!r}"
            )
        base = base_url or os.environ.get(BASE_URL_VARIABLE) or None
        self.base_url = base
        self.token_field: TokenField = max_tokens_field or token_field_for(base)
        # A field the user chose is kept; a guessed one may be switched once, when refused.
        self._field_may_switch = max_tokens_field is None
        self.strict_output = strict_output
        self._client = openai.AsyncOpenAI(
            api_key=key,
            base_url=base,
            organization=organization,
            timeout=self.timeout_s,
            max_retries=0,
        )
        self._formats: dict[int, tuple[Mapping[str, Any], dict[str, Any], Decoder]] = {}

    async def request(self, request: ModelRequest) -> ModelResponse:
        """One attempt at ``request``; failures raise :class:`~hierplan.errors.ModelError`."""
        params = self.build_params(request)
        with self._errors():
            completion = await self._client.chat.completions.create(**params)
        return self.parse_completion(completion, request)

    async def stream(self, request: ModelRequest) -> AsyncGenerator[StreamItem, None]:
        """One attempt at ``request``, streamed (``stream=True``, with the usage asked for in
        ``stream_options``): the text deltas as they come, then the whole response, read as
        :meth:`request` reads a completion. Closing it early closes the connection."""
        params = {**self.build_params(request), "stream": True}
        params["stream_options"] = {"include_usage": True}
        whole = _Streamed()
        with self._errors():
            chunks = await self._client.chat.completions.create(**params)
            try:
                async for chunk in chunks:
                    text = whole.add(chunk)
                    if text:
                        yield text
            finally:
                await chunks.close()
        yield self.parse_completion(whole.completion(self.model_name), request)

    @contextlib.contextmanager
    def _errors(self) -> Iterator[None]:
        """The SDK's errors as :class:`~hierplan.errors.ModelError`."""
        try:
            yield
        except openai.APITimeoutError as exc:
            raise timeout_error(self._name, self.timeout_s, after_sending=sent(exc)) from None
        except openai.APIConnectionError as exc:
            raise self._connection_error(exc) from None
        except openai.APIStatusError as exc:
            raise self._status_error(exc) from None
        except (openai.APIResponseValidationError, json.JSONDecodeError, ValueError) as exc:
            raise malformed_error(self._name, f"{type(exc).__name__}: {exc}") from None

    def _status_error(self, exc: openai.APIStatusError) -> ModelError:
        message = body_message(exc.body) or exc.message
        refused = self.token_field
        if self._field_may_switch and refuses_field(exc, message, refused):
            # The guess from the base URL was wrong for this server: the other field works on
            # the next attempt, where failing the node would fail every call of the run.
            self.token_field = _OTHER_FIELD[refused]
            self._field_may_switch = False
            return ModelError(
                f"{self._name}: HTTP {exc.status_code}: {message} (the server refuses "
                f"{refused}: the next attempt sends {self.token_field}; max_tokens_field="
                f"{self.token_field!r} in model_options sends it from the start)",
                retryable=True,
            )
        return status_error(
            self._name,
            exc.status_code,
            message,
            exc.response.headers,
            body=exc.body,
            url=str(exc.request.url),
        )

    def build_params(self, request: ModelRequest) -> dict[str, Any]:
        """The keyword arguments of ``chat.completions.create`` for ``request``."""
        names = ToolNames.of(request.tools, request.messages, TOOL_NAME_LIMIT)
        params: dict[str, Any] = {
            "model": self.model_name,
            "messages": wire_messages(request.messages, names),
            self.token_field: request.max_tokens,
        }
        if request.tools:
            params["tools"] = wire_tools(request.tools, names)
        if request.output_schema is not None:
            params["response_format"] = self._response_format(request.output_schema)
        if request.temperature is not None:
            params["temperature"] = request.temperature
        return params

    def _response_format(self, output: OutputSchema) -> dict[str, Any]:
        schema = self._format(output)[0]
        return {"type": "json_schema", "json_schema": {"name": output.name, **schema}}

    def _format(self, output: OutputSchema) -> tuple[dict[str, Any], Decoder]:
        # The plan schema is a module constant: rewrite it and compile its decoder once, not
        # on every planning call.
        cached = self._formats.get(id(output.schema))
        if cached is None or cached[0] is not output.schema:
            wire = self._wire_schema(output)
            decoder = strict_decoder(output.schema) if wire["strict"] else _unchanged
            cached = (output.schema, wire, decoder)
            self._formats[id(output.schema)] = cached
        return cached[1], cached[2]

    def _wire_schema(self, output: OutputSchema) -> dict[str, Any]:
        if self.strict_output:
            try:
                return {"schema": strict_schema(output.schema), "strict": True}
            except ValueError:
                pass  # not expressible in strict mode: send it as a plain schema
        return {"schema": dict(output.schema), "strict": False}

    def parse_completion(self, completion: Any, request: ModelRequest) -> ModelResponse:
        """A :class:`ModelResponse` from a ``ChatCompletion`` (raises on unreadable replies)."""
        usage = wire_usage(getattr(completion, "usage", None))
        choices = getattr(completion, "choices", None) or []
        if not choices:
            raise malformed_error(self._name, "the reply has no choices", usage)
        choice = choices[0]
        message = getattr(choice, "message", None)
        if message is None:
            raise malformed_error(self._name, "the reply has no message", usage)
        flags: list[str] = []
        text = _content_text(getattr(message, "content", None))
        refusal = getattr(message, "refusal", None)
        if refusal:
            text = str(refusal)
            flags.append("refusal")
        finish = str(getattr(choice, "finish_reason", None) or "stop")
        cut_at = request.max_tokens if finish == "length" else None
        raw_calls = getattr(message, "tool_calls", None) or ()
        # A reply the content filter stopped may end inside a tool call: its calls, cut or
        # whole, are not to be made, and the flag says why the reply has none.
        stopped = finish == "content_filter"
        names = ToolNames.of(request.tools, request.messages, TOOL_NAME_LIMIT)
        calls = () if stopped else tuple(self._tool_calls(raw_calls, names, usage, cut_at))
        if finish == "length":
            flags.append("truncated")
        elif finish == "content_filter":
            flags.append("content_filter")
        if usage is None:
            flags.append("no_usage")
        output = None
        wanted = request.output_schema
        if wanted is not None and text and not refusal:
            output = _structured(self._format(wanted)[1], text)
        if wanted is not None and output is None and cut_at is not None and not calls:
            # Cut JSON is not a plan the model got wrong: a repair attempt, asked with the
            # same max_tokens, would be cut too. Say which limit to raise instead.
            raise truncated_error(self._name, cut_at, f"the {wanted.name}", usage)
        return ModelResponse(
            text=text,
            tool_calls=calls,
            output=output,
            usage=usage,
            model=f"openai:{getattr(completion, 'model', None) or self.model_name}",
            finish_reason=finish,
            flags=flags,
        )

    def _tool_calls(
        self, raw: Sequence[Any], names: ToolNames, usage: Usage | None, cut_at: int | None
    ) -> list[ToolCall]:
        calls: list[ToolCall] = []
        for index, item in enumerate(raw):
            function = getattr(item, "function", None)
            if function is None:
                continue  # a custom (free-text) tool call: hierplan never offers those
            name = names.local(str(getattr(function, "name", "") or ""))
            arguments = getattr(function, "arguments", None) or "{}"
            parsed = tool_arguments(self._name, name, arguments, usage, cut_at=cut_at)
            call_id = str(getattr(item, "id", "") or f"call_{index}")
            calls.append(ToolCall(call_id, name, parsed))
        return calls


class _Streamed:
    """A streamed completion put back together from its chunks: its text, refusal, tool
    calls (by index), finish reason, model and usage, as :meth:`OpenAIModel.parse_completion`
    reads a whole one."""

    def __init__(self) -> None:
        self.text: list[str] = []
        self.refusal: list[str] = []
        self.calls: dict[int, dict[str, Any]] = {}
        self.finish: str | None = None
        self.model: str | None = None
        self.usage: Any = None

    def add(self, chunk: Any) -> str:
        """Take ``chunk`` in; the text it adds."""
        self.model = getattr(chunk, "model", None) or self.model
        if getattr(chunk, "usage", None) is not None:
            self.usage = chunk.usage
        added = ""
        for choice in getattr(chunk, "choices", None) or ():
            self.finish = getattr(choice, "finish_reason", None) or self.finish
            delta = getattr(choice, "delta", None)
            if delta is None:
                continue
            added += getattr(delta, "content", None) or ""
            self.refusal.append(getattr(delta, "refusal", None) or "")
            for part in getattr(delta, "tool_calls", None) or ():
                call = self.calls.setdefault(part.index, {"id": None, "name": "", "args": ""})
                call["id"] = getattr(part, "id", None) or call["id"]
                function = getattr(part, "function", None)
                if function is not None:
                    call["name"] += getattr(function, "name", None) or ""
                    call["args"] += getattr(function, "arguments", None) or ""
        self.text.append(added)
        return added

    def completion(self, model: str) -> SimpleNamespace:
        """The whole completion, shaped as the SDK's ``ChatCompletion`` is read."""
        calls = [
            SimpleNamespace(
                id=c["id"], function=SimpleNamespace(name=c["name"], arguments=c["args"])
            )
            for _, c in sorted(self.calls.items())
        ]
        message = SimpleNamespace(
            content="".join(self.text) or None,
            refusal="".join(self.refusal) or None,
            tool_calls=calls or None,
        )
        choice = SimpleNamespace(message=message, finish_reason=self.finish)
        return SimpleNamespace(
            choices=[choice] if self.finish or calls or message.content else [],
            usage=self.usage,
            model=self.model or model,
        )


def token_field_for(base_url: str | None) -> TokenField:
    """The field that carries ``max_tokens`` to a server: OpenAI's own API (and Azure OpenAI)
    take ``max_completion_tokens`` (reasoning models refuse ``max_tokens``); other servers
    speaking the format (vLLM, llama.cpp, Ollama...) know ``max_tokens``."""
    if not base_url:
        return "max_completion_tokens"
    host = (urlsplit(base_url).hostname or "").lower()
    if host == "api.openai.com" or host.endswith(".openai.azure.com"):
        return "max_completion_tokens"
    return "max_tokens"


def refuses_field(exc: openai.APIStatusError, message: str, field: TokenField) -> bool:
    """Whether an error says the server does not take ``field``, the parameter that carried
    ``max_tokens`` (OpenAI: "'max_tokens' is not supported with this model. Use
    'max_completion_tokens' instead."), rather than refusing its value."""
    if exc.status_code != 400:
        return False
    if exc.param == field and exc.code == "unsupported_parameter":
        return True
    if field not in message:
        return False
    lowered = message.lower()
    refusals = ("unsupported", "not supported", "unrecognized")
    return _OTHER_FIELD[field] in message or any(word in lowered for word in refusals)


def _structured(decode: Decoder, text: str) -> Any:
    """The structured output in ``text``, or ``None`` when it is not JSON (the planner then
    reads the text, fails to parse it, and asks for a repair with the error)."""
    try:
        data = loads_json(text)
    except ValueError:  # not JSON, or nested too deeply to read
        return None
    return decode(data)


def _part_text(part: Any) -> str | None:
    text = part.get("text") if isinstance(part, Mapping) else getattr(part, "text", None)
    return text if isinstance(text, str) else None


def _content_text(content: Any) -> str:
    """A message's content as text: a string, or the text of its parts when a server sends a
    list of content parts."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, Sequence):
        texts = [_part_text(part) for part in content]
        return "".join(t for t in texts if t)
    return str(content)


def _unchanged(value: Any) -> Any:
    return value


def wire_messages(
    messages: Sequence[Message], names: ToolNames | None = None
) -> list[dict[str, Any]]:
    """hierplan messages as Chat Completions messages (``names``: tool names on the wire)."""
    out: list[dict[str, Any]] = []
    for m in messages:
        if m.role == "tool":
            out.append({"role": "tool", "tool_call_id": m.tool_call_id or "", "content": m.content})
        elif m.role == "assistant" and m.tool_calls:
            out.append(
                {
                    "role": "assistant",
                    "content": m.content or None,
                    "tool_calls": [
                        {
                            "id": c.id,
                            "type": "function",
                            "function": {
                                "name": names.wire(c.name) if names else c.name,
                                "arguments": json.dumps(c.arguments),
                            },
                        }
                        for c in m.tool_calls
                    ],
                }
            )
        else:
            out.append({"role": m.role, "content": m.content})
    return out


def wire_tools(tools: Sequence[ToolSpec], names: ToolNames | None = None) -> list[dict[str, Any]]:
    """hierplan tool specs as Chat Completions function tools (not strict: tool arguments are
    validated by the tool itself, and its error goes back to the model; ``names``: tool names
    on the wire)."""
    return [
        {
            "type": "function",
            "function": {
                "name": names.wire(t.name) if names else t.name,
                "description": t.description,
                "parameters": dict(t.parameters),
            },
        }
        for t in tools
    ]


def wire_usage(raw: Any) -> Usage | None:
    """``CompletionUsage`` as :class:`Usage` (``None`` when the reply has none)."""
    if raw is None:
        return None
    prompt = getattr(raw, "prompt_tokens", None)
    completion = getattr(raw, "completion_tokens", None)
    if not isinstance(prompt, int) or not isinstance(completion, int):
        return None
    cached = _detail(getattr(raw, "prompt_tokens_details", None), "cached_tokens")
    reasoning = _detail(getattr(raw, "completion_tokens_details", None), "reasoning_tokens")
    return Usage(prompt, completion, min(cached, prompt), min(reasoning, completion))


def _detail(details: Any, field: str) -> int:
    if details is None:
        return 0
    value = details.get(field) if isinstance(details, Mapping) else getattr(details, field, None)
    return value if isinstance(value, int) and value > 0 else 0
