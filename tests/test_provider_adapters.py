"""The OpenAI and Anthropic adapters, one request at a time, through the real SDKs and the wire.

Each test runs the official SDK against the local wire server, which checks requests the way
the providers do (tool results paired with tool calls, strict schemas, alternating turns).
"""

from __future__ import annotations

import json
import urllib.request
from dataclasses import replace
from types import SimpleNamespace
from typing import Any

import openai
import pytest
from wire import MODELS, PROVIDERS, TEST_KEY, Reply, ScriptBackend, WireServer, anthropic_wire

from hierplan.agents.planner import PLAN_SCHEMA
from hierplan.errors import ModelAuthError, ModelError
from hierplan.models.base import Message, Model, ModelRequest, OutputSchema, ToolSpec
from hierplan.models.openai import OpenAIModel, token_field_for
from hierplan.plans.plan import Plan
from hierplan.pricing import PriceTable
from hierplan.runner.models import resolve_model
from hierplan.units import Usage

ADD = ToolSpec(
    "add",
    "Add two integers.",
    {
        "type": "object",
        "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
        "required": ["a", "b"],
        "additionalProperties": False,
    },
)
PLAN = {
    "goal": "Count the rows of two tables",
    "steps": [
        {
            "id": "a",
            "title": "Count A",
            "instruction": "Count a",
            "tool": "count",
            "args": {"t": 1},
        },
        {
            "id": "b",
            "title": "Count B",
            "instruction": "Count b",
            "depends_on": ["a"],
            "kind": "subgoal",
            "estimate_usd": 0.25,
        },
    ],
    "rationale": "a before b",
}


def ask(*content: str) -> tuple[Message, ...]:
    return (Message("system", "You help."), *(Message("user", c) for c in content))


def adapter(server: WireServer, provider: str, **options: Any) -> Model:
    return resolve_model(
        MODELS[provider], base_url=server.base_url(provider), api_key=TEST_KEY, **options
    )


async def one(server: WireServer, provider: str, request: ModelRequest, **options: Any) -> Any:
    model = adapter(server, provider, **options)
    try:
        return await model.request(request)
    finally:
        await model.aclose()  # type: ignore[attr-defined]


@pytest.mark.anyio
@pytest.mark.parametrize("provider", PROVIDERS)
async def test_text_reply_maps_usage_with_cached_and_reasoning_tokens(provider: str) -> None:
    reply = Reply(
        text="done", input_tokens=120, output_tokens=30, cached_tokens=100, reasoning_tokens=12
    )
    with WireServer(ScriptBackend([reply])) as server:
        response = await one(server, provider, ModelRequest(ask("Say done")))
    assert response.text == "done"
    assert response.usage == Usage(120, 30, cached_input_tokens=100, reasoning_tokens=12)
    assert response.model == MODELS[provider]
    assert response.flags == [] and not response.simulated and response.finish_reason == "stop"


@pytest.mark.anyio
async def test_anthropic_cache_writes_are_reported_apart_and_priced_above_input() -> None:
    # input_tokens 100 fresh + 200 read + 700 written (500 for five minutes, 200 for an hour)
    reply = Reply(
        text="done",
        input_tokens=1000,
        output_tokens=10,
        cached_tokens=200,
        cache_write_tokens=700,
        cache_write_1h_tokens=200,
    )
    with WireServer(ScriptBackend([reply])) as server:
        response = await one(server, "anthropic", ModelRequest(ask("Say done")))
    assert response.usage == Usage(
        1000, 10, cached_input_tokens=200, cache_write_tokens=700, cache_write_1h_tokens=200
    )
    # claude-haiku-4-5: $1/M input, $0.10 read, $1.25 five-minute write, $2 one-hour write, $5 out
    cost = PriceTable().cost("anthropic:claude-haiku-4-5", response.usage)
    assert cost == pytest.approx((100 * 1 + 200 * 0.1 + 500 * 1.25 + 200 * 2 + 10 * 5) / 1e6)


@pytest.mark.anyio
@pytest.mark.parametrize("provider", PROVIDERS)
async def test_reply_without_usage_has_none_and_a_flag(provider: str) -> None:
    with WireServer(ScriptBackend([Reply(text="done")])) as server:
        server.faults.script(["no_usage"])
        response = await one(server, provider, ModelRequest(ask("Say done")))
    assert response.text == "done"
    assert response.usage is None
    assert "no_usage" in response.flags


@pytest.mark.anyio
@pytest.mark.parametrize("provider", PROVIDERS)
async def test_tool_calls_and_results_round_trip(provider: str) -> None:
    prefix = "toolu_" if provider == "anthropic" else "call_"
    calls = [(prefix + "1", "add", {"a": 2, "b": 3}), (prefix + "2", "add", {"a": 4, "b": 5})]
    backend = ScriptBackend([Reply(text="Adding.", tool_calls=calls), Reply(text="5 and 9")])
    with WireServer(backend) as server:
        model = adapter(server, provider)
        first = await model.request(ModelRequest(ask("Add 2+3 and 4+5"), tools=(ADD,)))
        assert [(c.id, c.name, dict(c.arguments)) for c in first.tool_calls] == calls
        assert first.finish_reason == "tool_calls"
        followup = (
            *ask("Add 2+3 and 4+5"),
            Message("assistant", first.text, first.tool_calls),
            Message("tool", "5", tool_call_id=calls[0][0]),
            Message("tool", "ERROR: tool 'add' failed", tool_call_id=calls[1][0]),
        )
        second = await model.request(ModelRequest(followup, tools=(ADD,)))
        await model.aclose()  # type: ignore[attr-defined]
    assert second.text == "5 and 9"
    seen = backend.calls[1]
    assert seen.tools == ["add"]
    assert [(m.role, m.tool_call_id, m.content) for m in seen.messages if m.role == "tool"] == [
        ("tool", calls[0][0], "5"),
        ("tool", calls[1][0], "ERROR: tool 'add' failed"),
    ]
    assistant = next(m for m in seen.messages if m.role == "assistant")
    assert [c.arguments for c in assistant.tool_calls] == [c[2] for c in calls]
    if provider == "anthropic":
        # tool results go back in one user turn; a failed tool is marked as an error
        turn = seen.body["messages"][-1]
        assert turn["role"] == "user"
        assert [b.get("is_error", False) for b in turn["content"]] == [False, True]
    else:
        assert json.loads(seen.body["messages"][2]["tool_calls"][0]["function"]["arguments"]) == {
            "a": 2,
            "b": 3,
        }


@pytest.mark.anyio
@pytest.mark.parametrize("provider", PROVIDERS)
async def test_plan_comes_back_as_structured_output(provider: str) -> None:
    backend = ScriptBackend([Reply(output=PLAN)])
    request = ModelRequest(
        ask("Plan it"), output_schema=OutputSchema("plan", PLAN_SCHEMA), phase="planning"
    )
    with WireServer(backend) as server:
        response = await one(server, provider, request)
    assert Plan.model_validate(response.output) == Plan.model_validate(PLAN)
    assert response.tool_calls == ()
    body = backend.calls[0].body
    if provider == "openai":
        fmt = body["response_format"]
        assert fmt["type"] == "json_schema" and fmt["json_schema"]["strict"] is True
        assert fmt["json_schema"]["name"] == "plan"
        # the model wrote every property (null when absent) and args as a JSON string
        assert '"args": "{\\"t\\": 1}"' in response.text
    else:
        assert body["tool_choice"] == {"type": "tool", "name": "plan"}
        assert body["thinking"] == {"type": "disabled"}  # the API refuses thinking + forced tool
        assert body["tools"][0]["input_schema"] == PLAN_SCHEMA
        assert response.finish_reason == "stop"


@pytest.mark.anyio
async def test_anthropic_can_offer_the_plan_tool_without_forcing_it() -> None:
    backend = ScriptBackend([Reply(output=PLAN)])
    request = ModelRequest(ask("Plan it"), output_schema=OutputSchema("plan", PLAN_SCHEMA))
    with WireServer(backend) as server:
        response = await one(server, "anthropic", request, force_output_tool=False)
    assert Plan.model_validate(response.output) == Plan.model_validate(PLAN)
    body = backend.calls[0].body
    assert "tool_choice" not in body and "thinking" not in body
    assert [t["name"] for t in body["tools"]] == ["plan"]


@pytest.mark.anyio
async def test_the_wire_refuses_a_schema_that_is_not_strict() -> None:
    # The check the adapter's strict schema passes in every other test can fail.
    with WireServer(ScriptBackend([])) as server:
        client = openai.AsyncOpenAI(
            api_key=TEST_KEY, base_url=server.openai_base_url, max_retries=0
        )
        with pytest.raises(openai.BadRequestError, match="response_format 'plan'"):
            await client.chat.completions.create(
                model="gpt-5-mini",
                messages=[{"role": "user", "content": "plan"}],
                response_format={
                    "type": "json_schema",
                    "json_schema": {"name": "plan", "schema": PLAN_SCHEMA, "strict": True},
                },
            )
        await client.close()


@pytest.mark.anyio
async def test_openai_token_field_follows_the_server() -> None:
    with WireServer(ScriptBackend([Reply(text="a"), Reply(text="b")])) as server:
        await one(server, "openai", ModelRequest(ask("x"), max_tokens=77))
        await one(
            server,
            "openai",
            ModelRequest(ask("x"), max_tokens=88),
            max_tokens_field="max_completion_tokens",
        )
        bodies = [c.body for c in server.backend.calls]  # type: ignore[attr-defined]
    assert bodies[0]["max_tokens"] == 77 and "max_completion_tokens" not in bodies[0]
    assert bodies[1]["max_completion_tokens"] == 88 and "max_tokens" not in bodies[1]
    assert OpenAIModel("gpt-5-mini", api_key="k").token_field == "max_completion_tokens"


@pytest.mark.anyio
async def test_anthropic_streams_so_large_max_tokens_are_not_refused() -> None:
    backend = ScriptBackend([Reply(text="long answer")])
    with WireServer(backend) as server:
        response = await one(server, "anthropic", ModelRequest(ask("x"), max_tokens=128_000))
    assert response.text == "long answer"
    assert backend.calls[0].body["stream"] is True
    assert backend.calls[0].max_tokens == 128_000


RETRYABLE = ("rate_limit", "server_error", "overloaded", "slow", "stall", "malformed", "truncated")


@pytest.mark.anyio
@pytest.mark.parametrize("provider", PROVIDERS)
@pytest.mark.parametrize("kind", [*RETRYABLE, "stream_error", "stream_timeout"])
async def test_faults_become_retryable_model_errors(provider: str, kind: str) -> None:
    with WireServer(ScriptBackend([Reply(text="x")]), slow_s=1.0) as server:
        server.faults.script([kind])
        with pytest.raises(ModelError) as caught:
            await one(server, provider, ModelRequest(ask("x")), timeout_s=0.3)
    error = caught.value
    assert error.retryable, str(error)
    assert str(error).startswith(MODELS[provider] + ": ")
    assert error.retry_after == (0.05 if kind == "rate_limit" else None)
    if kind in ("rate_limit", "server_error", "overloaded"):
        assert "HTTP " in str(error)


@pytest.mark.anyio
@pytest.mark.parametrize("provider", PROVIDERS)
async def test_retry_after_in_whole_seconds(provider: str) -> None:
    with WireServer(ScriptBackend([]), retry_after_s=2, retry_after_ms=False) as server:
        server.faults.script(["rate_limit"])
        with pytest.raises(ModelError) as caught:
            await one(server, provider, ModelRequest(ask("x")))
    assert caught.value.retry_after == 2.0


@pytest.mark.anyio
@pytest.mark.parametrize("provider", PROVIDERS)
async def test_bad_request_is_not_retryable_and_keeps_the_providers_message(provider: str) -> None:
    with WireServer(ScriptBackend([])) as server:
        server.faults.script(["bad_request"])
        with pytest.raises(ModelError) as caught:
            await one(server, provider, ModelRequest(ask("x")))
    assert not caught.value.retryable
    assert "HTTP 400: invalid_request_error:" in str(caught.value)
    assert ("maximum context" if provider == "openai" else "prompt is too long") in str(
        caught.value
    )


@pytest.mark.anyio
@pytest.mark.parametrize("provider", PROVIDERS)
async def test_a_wrong_key_is_an_auth_error(provider: str) -> None:
    with WireServer(ScriptBackend([])) as server:
        model = resolve_model(
            MODELS[provider], base_url=server.base_url(provider), api_key="wrong-key"
        )
        with pytest.raises(ModelAuthError, match=r"HTTP 401: .*invalid or missing API key"):
            await model.request(ModelRequest(ask("x")))
        await model.aclose()  # type: ignore[attr-defined]
        assert server.count() == 1


def test_the_wire_accepts_bearer_and_x_api_key_on_both_paths() -> None:
    backend = ScriptBackend([Reply(text="a"), Reply(text="b"), Reply(text="c")])
    bodies = {
        "/v1/chat/completions": {"model": "m", "messages": [{"role": "user", "content": "x"}]},
        "/v1/messages": {
            "model": "m",
            "max_tokens": 5,
            "messages": [{"role": "user", "content": "x"}],
        },
    }
    with WireServer(backend) as server:
        statuses = []
        for path, header in (
            ("/v1/chat/completions", {"x-api-key": TEST_KEY}),
            ("/v1/messages", {"Authorization": f"Bearer {TEST_KEY}"}),
            ("/v1/messages", {"x-api-key": TEST_KEY}),
        ):
            req = urllib.request.Request(
                server.url + path,
                data=json.dumps(bodies[path]).encode(),
                headers={"content-type": "application/json", **header},
            )
            with urllib.request.urlopen(req, timeout=5) as reply:
                statuses.append(reply.status)
    assert statuses == [200, 200, 200]


def test_unreadable_tool_arguments_are_a_retryable_error_with_usage() -> None:
    model = OpenAIModel("gpt-5-mini", api_key="k")
    completion = SimpleNamespace(
        model="gpt-5-mini",
        usage=SimpleNamespace(prompt_tokens=10, completion_tokens=3),
        choices=[
            SimpleNamespace(
                finish_reason="tool_calls",
                message=SimpleNamespace(
                    content=None,
                    refusal=None,
                    tool_calls=[
                        SimpleNamespace(
                            id="c1", function=SimpleNamespace(name="add", arguments='{"a": 1')
                        )
                    ],
                ),
            )
        ],
    )
    with pytest.raises(ModelError, match="arguments of tool call 'add' are not JSON") as caught:
        model.parse_completion(completion, ModelRequest(ask("x")))
    assert caught.value.retryable and caught.value.usage == Usage(10, 3)


def test_a_refusal_is_text_with_a_flag_and_no_output() -> None:
    model = OpenAIModel("gpt-5-mini", api_key="k")
    completion = SimpleNamespace(
        model="gpt-5-mini",
        usage=None,
        choices=[
            SimpleNamespace(
                finish_reason="stop",
                message=SimpleNamespace(content=None, refusal="I can't help.", tool_calls=None),
            )
        ],
    )
    request = ModelRequest(ask("x"), output_schema=OutputSchema("plan", PLAN_SCHEMA))
    response = model.parse_completion(completion, request)
    assert (response.text, response.output) == ("I can't help.", None)
    assert response.flags == ["refusal", "no_usage"]


def test_models_that_always_think_are_not_forced_to_call_the_plan_tool() -> None:
    fable = resolve_model("anthropic:claude-fable-5", api_key="k")
    haiku = resolve_model("anthropic:claude-haiku-4-5", api_key="k")
    request = ModelRequest(ask("Plan it"), output_schema=OutputSchema("plan", PLAN_SCHEMA))
    assert "tool_choice" not in fable.build_params(request)  # type: ignore[attr-defined]
    assert haiku.build_params(request)["tool_choice"]["name"] == "plan"  # type: ignore[attr-defined]


@pytest.mark.anyio
async def test_thinking_blocks_go_back_with_the_turn_that_called_tools() -> None:
    calls = [("toolu_1", "add", {"a": 2, "b": 3})]
    backend = ScriptBackend(
        [
            Reply(thinking="2+3: use the tool.", tool_calls=calls, reasoning_tokens=7),
            Reply(text="5"),
        ]
    )
    with WireServer(backend) as server:
        options: dict[str, Any] = {"base_url": server.anthropic_base_url, "api_key": TEST_KEY}
        model = resolve_model("anthropic:claude-sonnet-5", **options)  # thinks by default
        first = await model.request(ModelRequest(ask("Add 2+3"), tools=(ADD,)))
        assert first.text == "" and first.usage is not None and first.usage.reasoning_tokens == 7
        followup = (
            *ask("Add 2+3"),
            Message("assistant", first.text, first.tool_calls),
            Message("tool", "5", tool_call_id="toolu_1"),
        )
        second = await model.request(ModelRequest(followup, tools=(ADD,)))
        assert second.text == "5"
        sent = backend.calls[1].body["messages"][1]["content"]
        assert [b["type"] for b in sent] == ["thinking", "tool_use"]
        # Without the blocks (another client never saw them) the API refuses the turn.
        other = resolve_model("anthropic:claude-sonnet-5", **options)
        with pytest.raises(ModelError, match=r"HTTP 400: .*Expected `thinking`"):
            await other.request(ModelRequest(followup, tools=(ADD,)))
        for m in (model, other):
            await m.aclose()  # type: ignore[attr-defined]


ADD_CALL = [("call_1", "add", {"a": 2, "b": 3})]


@pytest.mark.anyio
@pytest.mark.parametrize("provider", PROVIDERS)
async def test_a_tool_call_cut_at_max_tokens_is_not_retried_and_says_what_to_raise(
    provider: str,
) -> None:
    cut = Reply(tool_calls=ADD_CALL, raw_arguments='{"a": 2, "b', finish="length")
    with WireServer(ScriptBackend([cut])) as server, pytest.raises(ModelError) as caught:
        await one(server, provider, ModelRequest(ask("Add"), tools=(ADD,), max_tokens=64))
    error = caught.value
    # The same request would be cut at the same place, and every attempt is paid in full.
    assert not error.retryable
    assert "cut at max_tokens=64" in str(error) and "executor_max_tokens" in str(error)
    assert error.usage is not None and error.usage.output_tokens > 0


@pytest.mark.anyio
@pytest.mark.parametrize("provider", PROVIDERS)
async def test_json_nested_too_deeply_is_an_unreadable_reply_not_a_crash(provider: str) -> None:
    deep = "[" * 5000
    plan_request = ModelRequest(ask("Plan"), output_schema=OutputSchema("plan", PLAN_SCHEMA))
    script = [Reply(raw_output=deep), Reply(tool_calls=ADD_CALL, raw_arguments=deep)]
    with WireServer(ScriptBackend(script)) as server:
        plan = await one(server, provider, plan_request)
        with pytest.raises(ModelError) as caught:
            await one(server, provider, ModelRequest(ask("Add"), tools=(ADD,)))
    # A plan that cannot be read goes back to the planner as text, which asks for a repair.
    assert plan.output is None and plan.text == deep
    assert caught.value.retryable and "nested too deeply" in str(caught.value)


@pytest.mark.anyio
@pytest.mark.parametrize("provider", PROVIDERS)
async def test_tool_arguments_with_a_key_given_twice_are_refused(provider: str) -> None:
    # Read with json.loads, {"a": 2, "b": 3, "a": 7} would add 7 and 3, silently.
    reply = Reply(tool_calls=ADD_CALL, raw_arguments='{"a": 2, "b": 3, "a": 7}')
    with WireServer(ScriptBackend([reply])) as server, pytest.raises(ModelError) as caught:
        await one(server, provider, ModelRequest(ask("Add"), tools=(ADD,)))
    assert "'a' given more than once in one object: keep one" in str(caught.value)


@pytest.mark.anyio
async def test_openai_tool_arguments_sent_as_an_object_are_read() -> None:
    reply = Reply(tool_calls=ADD_CALL, object_arguments=True)
    with WireServer(ScriptBackend([reply])) as server:
        response = await one(server, "openai", ModelRequest(ask("Add"), tools=(ADD,)))
    assert [(c.name, dict(c.arguments)) for c in response.tool_calls] == [("add", {"a": 2, "b": 3})]


@pytest.mark.anyio
async def test_openai_refusals_and_content_filter_stops_are_flagged() -> None:
    script = [Reply(refusal="I can't help with that."), Reply(finish="content_filter")]
    with WireServer(ScriptBackend(script)) as server:
        refused = await one(server, "openai", ModelRequest(ask("x")))
        filtered = await one(server, "openai", ModelRequest(ask("y")))
    assert refused.text == "I can't help with that." and "refusal" in refused.flags
    assert filtered.text == "" and "content_filter" in filtered.flags


def test_openai_content_parts_are_read_as_text() -> None:
    model = OpenAIModel("gpt-5-mini", api_key="k")
    parts = [{"type": "text", "text": "Hello, "}, {"type": "text", "text": "world"}]
    completion = openai.types.chat.ChatCompletion.model_construct(
        id="c",
        model="gpt-5-mini",
        object="chat.completion",
        created=0,
        usage=None,
        choices=[
            openai.types.chat.chat_completion.Choice.model_construct(
                index=0,
                finish_reason="stop",
                message=openai.types.chat.ChatCompletionMessage.model_construct(
                    # A list of parts, as some servers send: not what the SDK's type says.
                    role="assistant",
                    content=parts,  # type: ignore[arg-type]
                    refusal=None,
                    tool_calls=None,
                ),
            )
        ],
    )
    assert model.parse_completion(completion, ModelRequest(ask("x"))).text == "Hello, world"


def test_openai_token_field_for_openai_and_azure_hosts_whatever_the_url_says() -> None:
    assert token_field_for(None) == "max_completion_tokens"
    assert token_field_for("https://api.openai.com/v1") == "max_completion_tokens"
    assert token_field_for("https://my-res.openai.azure.com/openai/v1") == "max_completion_tokens"
    assert token_field_for("http://localhost:11434/v1") == "max_tokens"
    assert token_field_for("https://openai.example.com/v1") == "max_tokens"


@pytest.mark.anyio
async def test_a_used_up_quota_is_not_retried_and_says_what_to_do() -> None:
    with WireServer(ScriptBackend([])) as server:
        server.faults.script(["quota"])
        with pytest.raises(ModelError) as caught:
            await one(server, "openai", ModelRequest(ask("x")))
    assert not caught.value.retryable
    assert "HTTP 429" in str(caught.value) and "add credit or use another key" in str(caught.value)


@pytest.mark.anyio
@pytest.mark.parametrize("refused", ["max_tokens", "max_completion_tokens"])
async def test_a_refused_token_field_is_switched_for_the_next_attempt(refused: str) -> None:
    # A gateway in front of OpenAI's reasoning models refuses max_tokens; an older server may
    # refuse max_completion_tokens. The field guessed from the URL gives way to the other one.
    other = "max_completion_tokens" if refused == "max_tokens" else "max_tokens"
    backend = ScriptBackend([Reply(text="a"), Reply(text="b")])
    with WireServer(backend, refused_fields=[refused]) as server:
        model = adapter(server, "openai")
        model.token_field = refused  # type: ignore[attr-defined]
        with pytest.raises(ModelError) as caught:
            await model.request(ModelRequest(ask("x"), max_tokens=50))
        first = await model.request(ModelRequest(ask("x"), max_tokens=60))
        second = await model.request(ModelRequest(ask("y"), max_tokens=70))
        await model.aclose()  # type: ignore[attr-defined]
    assert caught.value.retryable
    message = str(caught.value)
    assert f"Unsupported parameter: '{refused}'" in message
    assert f"the next attempt sends {other}" in message and f"max_tokens_field='{other}'" in message
    assert (first.text, second.text) == ("a", "b")
    assert [c.body.get(other) for c in backend.calls] == [60, 70]
    assert all(refused not in c.body for c in backend.calls)


@pytest.mark.anyio
async def test_a_token_field_the_user_chose_is_kept_when_refused() -> None:
    with WireServer(ScriptBackend([]), refused_fields=["max_tokens"]) as server:
        model = adapter(server, "openai", max_tokens_field="max_tokens")
        for _ in range(2):
            with pytest.raises(ModelError, match=r"HTTP 400: .*'max_tokens' is not") as caught:
                await model.request(ModelRequest(ask("x")))
            assert not caught.value.retryable
        await model.aclose()  # type: ignore[attr-defined]
        assert server.count() == 2


@pytest.mark.anyio
@pytest.mark.parametrize("provider", PROVIDERS)
async def test_a_plan_cut_at_max_tokens_is_not_retried_and_says_what_to_raise(
    provider: str,
) -> None:
    cut = Reply(raw_output='{"goal": "Count rows", "steps": [{"id": "a", "ti', finish="length")
    request = ModelRequest(
        ask("Plan"), output_schema=OutputSchema("plan", PLAN_SCHEMA), max_tokens=32
    )
    with WireServer(ScriptBackend([cut])) as server, pytest.raises(ModelError) as caught:
        await one(server, provider, request)
    error = caught.value
    # Not a plan the model got wrong: a repair asked with the same limit would be cut too.
    assert not error.retryable
    assert "cut at max_tokens=32 in the middle of the plan" in str(error)
    assert "planner_max_tokens" in str(error)
    assert error.usage is not None and error.usage.output_tokens > 0


@pytest.mark.anyio
async def test_a_request_above_the_tokens_per_minute_limit_is_not_retried() -> None:
    # A 429 that no wait cures: the one request is larger than the whole per-minute limit.
    with WireServer(ScriptBackend([])) as server:
        server.faults.script(["too_large"])
        with pytest.raises(ModelError) as caught:
            await one(server, "openai", ModelRequest(ask("x")))
    assert not caught.value.retryable
    message = str(caught.value)
    assert "HTTP 429: tokens: Request too large for gpt-5-mini" in message
    assert "waiting does not help: lower executor_max_tokens / planner_max_tokens" in message


@pytest.mark.anyio
@pytest.mark.parametrize(
    ("provider", "suffix", "hint"),
    [
        ("openai", "", "if the server serves the API under /v1, as OpenAI-compatible servers do"),
        ("anthropic", "/v1", "give the base URL without the /v1 that the client adds itself"),
    ],
    ids=["openai-without-v1", "anthropic-with-v1"],
)
async def test_a_base_url_without_or_with_an_extra_v1_gets_a_404_saying_so(
    provider: str, suffix: str, hint: str
) -> None:
    # OpenAI's base URL ends in /v1, Anthropic's does not: each is easy to get the wrong way.
    with WireServer(ScriptBackend([])) as server:
        model = resolve_model(MODELS[provider], base_url=server.url + suffix, api_key=TEST_KEY)
        with pytest.raises(ModelError) as caught:
            await model.request(ModelRequest(ask("x")))
        await model.aclose()  # type: ignore[attr-defined]
    message = str(caught.value)
    assert not caught.value.retryable
    assert "HTTP 404" in message and f"the request went to {server.url}{suffix}/" in message
    assert hint in message


@pytest.mark.anyio
@pytest.mark.parametrize("thinking", ["", "2+3: use the tool."])
async def test_anthropic_blocks_streamed_whole_are_read_whole(thinking: str) -> None:
    # Anthropic's API streams a block's content in deltas; a server speaking its format may
    # put it all in content_block_start, which the SDK accepts as the block's content.
    calls = [("toolu_1", "add", {"a": 2, "b": 3})]
    reply = Reply(text="Adding.", tool_calls=calls, thinking=thinking, whole_blocks=True)
    plan = Reply(output=PLAN, whole_blocks=True)
    backend = ScriptBackend([reply, plan, Reply(text="5")])
    with WireServer(backend) as server:
        model = adapter(server, "anthropic")
        called = await model.request(ModelRequest(ask("Add 2+3"), tools=(ADD,)))
        planned = await model.request(
            ModelRequest(ask("Plan it"), output_schema=OutputSchema("plan", PLAN_SCHEMA))
        )
        followup = (
            *ask("Add 2+3"),
            Message("assistant", called.text, called.tool_calls),
            Message("tool", "5", tool_call_id="toolu_1"),
        )
        await model.request(ModelRequest(followup, tools=(ADD,)))
        await model.aclose()  # type: ignore[attr-defined]
    assert called.text == "Adding."
    assert [(c.id, c.name, dict(c.arguments)) for c in called.tool_calls] == calls
    assert Plan.model_validate(planned.output) == Plan.model_validate(PLAN)
    sent = backend.calls[2].body["messages"][1]["content"]
    expected = [{"type": "thinking", "thinking": thinking}] if thinking else []
    assert [b for b in sent if b["type"] == "thinking"] == [
        {**e, "signature": anthropic_wire.signature(thinking)} for e in expected
    ]


@pytest.mark.anyio
async def test_an_anthropic_stream_that_stalls_is_a_timeout_with_the_usage_so_far() -> None:
    # Streamed replies are bounded per event: a stream that stops halfway hits timeout_s.
    with WireServer(ScriptBackend([]), slow_s=1.0) as server:
        server.faults.script(["stall"])
        with pytest.raises(ModelError) as caught:
            await one(server, "anthropic", ModelRequest(ask("x")), timeout_s=0.3)
    error = caught.value
    assert error.retryable
    assert "the reply stream stopped for 0.3 s (timeout_s)" in str(error)
    assert error.usage is not None and error.usage.input_tokens > 0


DECLINED = "This request was declined because it could enable cyber harm."


@pytest.mark.anyio
async def test_an_anthropic_refusal_in_a_tool_call_is_a_refusal_not_a_malformed_reply() -> None:
    # The API's classifiers can stop a reply anywhere, a tool call's input included.
    refused = Reply(
        text="Sure, I will", tool_calls=ADD_CALL, raw_arguments='{"a": 2', finish="refusal"
    )
    script = [replace(refused, refusal=DECLINED), refused]
    with WireServer(ScriptBackend(script)) as server:
        explained = await one(server, "anthropic", ModelRequest(ask("Add"), tools=(ADD,)))
        bare = await one(server, "anthropic", ModelRequest(ask("Add"), tools=(ADD,)))
    for response in (explained, bare):
        assert response.tool_calls == () and response.output is None
        assert response.flags == ["refusal"] and response.finish_reason == "refusal"
        assert response.usage is not None and response.usage.output_tokens > 0
    assert explained.text == DECLINED
    assert bare.text == "Sure, I will"  # no explanation: what the model had written


@pytest.mark.anyio
async def test_openai_tool_calls_the_content_filter_stopped_are_not_made() -> None:
    # The filter may stop a reply inside a tool call: not a malformed reply to retry.
    stopped = Reply(tool_calls=ADD_CALL, raw_arguments='{"a": 2, "b', finish="content_filter")
    with WireServer(ScriptBackend([stopped])) as server:
        response = await one(server, "openai", ModelRequest(ask("Add"), tools=(ADD,)))
    assert response.tool_calls == () and response.finish_reason == "content_filter"
    assert response.flags == ["content_filter"]


@pytest.mark.anyio
async def test_a_full_anthropic_context_window_is_not_blamed_on_max_tokens() -> None:
    full = Reply(text="The rows are", input_tokens=199_000, finish="model_context_window_exceeded")
    with WireServer(ScriptBackend([full])) as server, pytest.raises(ModelError) as caught:
        await one(server, "anthropic", ModelRequest(ask("Count"), max_tokens=64_000))
    error = caught.value
    assert not error.retryable
    assert "filled the model's context window (199000 input tokens)" in str(error)
    assert "a larger max_tokens does not help" in str(error)
    assert error.usage is not None and error.usage.input_tokens == 199_000


@pytest.mark.anyio
@pytest.mark.parametrize("provider", PROVIDERS)
async def test_an_html_error_page_from_a_proxy_is_one_short_line(provider: str) -> None:
    with WireServer(ScriptBackend([])) as server:
        server.faults.script(["html_error"])
        with pytest.raises(ModelError) as caught:
            await one(server, provider, ModelRequest(ask("x")))
    message = str(caught.value)
    status = "502 Bad Gateway" if provider == "openai" else "401 Authorization Required"
    assert f"<title>{status}</title>" in message
    assert "\n" not in message and "\r" not in message
    assert len(message) < 400 and message.endswith("…")


@pytest.mark.anyio
@pytest.mark.parametrize("provider", PROVIDERS)
async def test_tool_names_the_apis_refuse_go_by_safe_names_on_the_wire(provider: str) -> None:
    # MCP tool names may hold dots and slashes; both APIs refuse them in tool names.
    dotted = ToolSpec("math.add", ADD.description, ADD.parameters)
    slashed = ToolSpec("math/add", ADD.description, ADD.parameters)
    tools = (dotted, slashed, ADD)
    prefix = "toolu_" if provider == "anthropic" else "call_"
    wire_calls = [(prefix + "1", "math_add", {"a": 1, "b": 2}), (prefix + "2", "add", {"a": 3})]
    backend = ScriptBackend([Reply(tool_calls=wire_calls), Reply(text="3")])
    with WireServer(backend) as server:
        model = adapter(server, provider)
        first = await model.request(ModelRequest(ask("Add"), tools=tools))
        followup = (
            *ask("Add"),
            Message("assistant", "", first.tool_calls),
            *(Message("tool", "3", tool_call_id=c.id) for c in first.tool_calls),
        )
        await model.request(ModelRequest(followup, tools=tools))
        await model.aclose()  # type: ignore[attr-defined]
    assert [c.name for c in first.tool_calls] == ["math.add", "add"]
    assert [c.arguments for c in first.tool_calls] == [{"a": 1, "b": 2}, {"a": 3}]
    # the same tools map the same way on every turn, and a valid name stays as it is
    assert backend.calls[0].tools == backend.calls[1].tools == ["math_add", "math_add_2", "add"]
    assistant = next(m for m in backend.calls[1].messages if m.role == "assistant")
    assert [c.name for c in assistant.tool_calls] == ["math_add", "add"]


@pytest.mark.anyio
async def test_anthropic_blank_text_before_a_tool_call_is_not_sent_back() -> None:
    # A model may write only blank text before a tool call; the API refuses blank text blocks
    # in the conversation sent back with the tool's result.
    backend = ScriptBackend([Reply(text="\n\n", tool_calls=ADD_CALL), Reply(text="5")])
    with WireServer(backend) as server:
        model = adapter(server, "anthropic")
        first = await model.request(ModelRequest(ask("Add"), tools=(ADD,)))
        followup = (
            *ask("Add", " "),
            Message("assistant", first.text, first.tool_calls),
            Message("tool", "5", tool_call_id="call_1"),
        )
        second = await model.request(ModelRequest(followup, tools=(ADD,)))
        await model.aclose()  # type: ignore[attr-defined]
    assert first.text == "\n\n" and second.text == "5"
    sent = backend.calls[1].body["messages"]
    assert [b["type"] for b in sent[1]["content"]] == ["tool_use"]
    assert sent[0]["content"] == [{"type": "text", "text": "Add"}]
