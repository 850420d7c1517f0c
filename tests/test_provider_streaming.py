"""The OpenAI and Anthropic adapters' streams, through the real SDKs against the local wire
server on 127.0.0.1: text deltas as they come, then the same response ``request`` gives; and a
run whose planning call streams over the wire."""

from __future__ import annotations

from contextlib import aclosing
from typing import Any

import pytest
from wire import MODELS, PROVIDERS, TEST_KEY, Reply, ScriptBackend, WireServer, model_options

import hierplan
from hierplan import tool
from hierplan.models.base import Message, Model, ModelRequest, ModelResponse, ToolSpec
from hierplan.runner.models import resolve_model
from hierplan.units import Usage

pytestmark = pytest.mark.anyio

PLAN_TEXT = (
    "1. add(2, 3)\n"
    "2. add(4, 5)\n"
    "3. add($1, $2)\n"
    "rationale: the two sums first, in parallel, then their sum; nothing is left out\n"
)
ADD = ToolSpec(
    "add",
    "Add two integers.",
    {
        "type": "object",
        "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
        "required": ["a", "b"],
    },
)
REQUEST = ModelRequest((Message("system", "You plan."), Message("user", "Plan the sums")))


def adapter(server: WireServer, provider: str) -> Model:
    return resolve_model(MODELS[provider], base_url=server.base_url(provider), api_key=TEST_KEY)


async def streamed(model: Any, request: ModelRequest) -> tuple[list[str], ModelResponse]:
    deltas: list[str] = []
    response: ModelResponse | None = None
    async with aclosing(model.stream(request)) as items:
        async for item in items:
            if isinstance(item, ModelResponse):
                response = item
            else:
                deltas.append(item)
    assert response is not None
    return deltas, response


@pytest.mark.parametrize("provider", PROVIDERS)
async def test_a_stream_brings_the_text_in_pieces_and_ends_with_the_whole_response(
    provider: str,
) -> None:
    reply = Reply(text=PLAN_TEXT, input_tokens=300, output_tokens=40, cached_tokens=100)
    with WireServer(ScriptBackend([reply, reply])) as server:
        model = adapter(server, provider)
        try:
            deltas, response = await streamed(model, REQUEST)
            whole = await model.request(REQUEST)
        finally:
            await model.aclose()  # type: ignore[attr-defined]
        (first, _) = server.backend.calls  # type: ignore[attr-defined]
    assert len(deltas) > 1 and "".join(deltas) == PLAN_TEXT
    assert response.text == whole.text == PLAN_TEXT
    assert response.usage == whole.usage == Usage(300, 40, cached_input_tokens=100)
    assert (response.finish_reason, response.flags) == ("stop", [])
    assert response.model == MODELS[provider]
    assert first.body["stream"] is True
    if provider == "openai":
        assert first.body["stream_options"] == {"include_usage": True}


async def test_an_openai_stream_puts_tool_calls_and_refusals_back_together() -> None:
    calls = [("call_1", "add", {"a": 2, "b": 3}), ("call_2", "add", {"a": 4, "b": 5})]
    script = [Reply(text="Adding.", tool_calls=calls), Reply(refusal="I cannot help with that")]
    with WireServer(ScriptBackend(script)) as server:
        model = adapter(server, "openai")
        request = ModelRequest(REQUEST.messages, tools=(ADD,))
        try:
            _, adding = await streamed(model, request)
            _, refused = await streamed(model, REQUEST)
        finally:
            await model.aclose()  # type: ignore[attr-defined]
    assert [(c.id, c.name, dict(c.arguments)) for c in adding.tool_calls] == calls
    assert adding.finish_reason == "tool_calls" and adding.text == "Adding."
    assert refused.text == "I cannot help with that" and "refusal" in refused.flags


@pytest.mark.parametrize("provider", PROVIDERS)
async def test_a_dag_runs_the_plan_it_streams_over_the_wire(provider: str) -> None:
    @tool
    def add(a: int, b: int) -> int:
        """Add two integers."""
        return a + b

    backend = ScriptBackend([Reply(text=PLAN_TEXT)])
    with WireServer(backend) as server:
        result = await hierplan.run(
            "Add 2 and 3, 4 and 5, then the two sums",
            model=hierplan.ModelSpec(name=MODELS[provider], **model_options(server, provider)),
            strategy="dag",
            tools=[add],
        )
    backend.assert_complete()
    assert result.status == "succeeded" and result.answer == "14"
    (version,) = result.tree.plan_versions
    assert version.decided_by == "stream" and len(version.plan.steps) == 3
    assert all(c.parsed_at is not None for c in result.tree.children)
    (call,) = result.tree.calls
    assert call.ok and call.usage.output_tokens > 0
