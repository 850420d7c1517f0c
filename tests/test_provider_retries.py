"""Provider faults inside a run: retried and counted, or failed fast with the provider's message.

A small run (one plan, one executor answer) goes over the wire; the server injects a fault into
a chosen request and logs every request it gets. The run record must hold one call record per
request the server saw: the SDKs' own retries are off, and hierplan's one retry loop records
every attempt.
"""

from __future__ import annotations

import time
from contextlib import asynccontextmanager
from typing import Any

import pytest
from wire import MODELS, PROVIDERS, Reply, ScriptBackend, WireServer, calls, model_options

import hierplan
from hierplan.core.events import RunEvent, StepRetried
from hierplan.core.settings import RunSettings
from hierplan.errors import ModelAuthError, ModelError
from hierplan.models.anthropic import AnthropicModel
from hierplan.models.base import Model, ModelRequest, ModelResponse
from hierplan.models.openai import OpenAIModel
from hierplan.models.retry import RetryPolicy
from hierplan.records import RunResult
from hierplan.view.html import render_html

pytestmark = pytest.mark.anyio

GOAL = "Greet the user"
PLAN = {
    "goal": GOAL,
    "steps": [{"id": "greet", "title": "Greet", "instruction": "Say hello to the user"}],
}
RETRIED = ("rate_limit", "server_error", "overloaded", "slow", "stall", "malformed", "truncated")


def script() -> ScriptBackend:
    return ScriptBackend([Reply(output=PLAN), Reply(text="hello")])


async def mini_run(
    server: WireServer, provider: str, *, timeout_s: float = 0.4, **settings: Any
) -> RunResult:
    return await hierplan.run(
        GOAL,
        model=hierplan.ModelSpec(
            name=MODELS[provider], **model_options(server, provider, timeout_s=timeout_s)
        ),
        settings=hierplan.RunSettings(retry_backoff_s=0, **settings),
    )


@pytest.mark.parametrize("provider", PROVIDERS)
@pytest.mark.parametrize("kind", RETRIED)
@pytest.mark.parametrize("at", [0, 1], ids=["planner", "executor"])
async def test_each_fault_is_retried_and_every_attempt_recorded(
    provider: str, kind: str, at: int
) -> None:
    with WireServer(script(), slow_s=1.0) as server:
        server.faults.script([None] * at + [kind])
        result = await mini_run(server, provider)
        hits = server.count()
    assert result.status == "succeeded", result.error
    assert result.answer == "hello"
    records = calls(result)
    assert len(records) == hits == 3
    failed = [c for c in records if not c.ok]
    assert len(failed) == 1 and "failed" in failed[0].flags and failed[0].attempt == 1
    node = [n for n in result.nodes() if n.calls][at]
    assert [(c.attempt, c.ok) for c in node.calls] == [(1, False), (2, True)]
    assert all(c.ok and c.usage.input_tokens > 0 for c in records if c is not failed[0])


async def test_an_error_event_inside_an_anthropic_stream_is_retried() -> None:
    with WireServer(script()) as server:
        server.faults.script(["stream_error"])
        result = await mini_run(server, "anthropic")
        assert server.count() == 3
    assert result.status == "succeeded"
    assert [c.ok for c in calls(result)] == [False, True, True]


@pytest.mark.parametrize("provider", PROVIDERS)
async def test_a_reply_without_usage_is_recorded_and_flagged(provider: str) -> None:
    with WireServer(script()) as server:
        server.faults.script(["no_usage"])
        result = await mini_run(server, provider)
    records = calls(result)
    assert result.status == "succeeded" and len(records) == 2
    assert "no_usage" in records[0].flags and records[0].ok
    # counted at the request's worst case, as a budget would settle it, never as free
    assert records[0].usage.input_tokens > 0
    assert records[0].usage.output_tokens == RunSettings().planner_max_tokens
    assert records[0].cost_usd is not None and records[0].cost_usd > 0
    assert "no_usage" not in records[1].flags and records[1].usage.total_tokens > 0


@pytest.mark.parametrize("provider", PROVIDERS)
async def test_a_bad_request_fails_fast_with_the_providers_message(provider: str) -> None:
    with WireServer(script()) as server:
        server.faults.script(["bad_request"])
        result = await mini_run(server, provider)
        assert server.count() == 1
    assert result.status == "failed"
    assert result.error is not None and "HTTP 400: invalid_request_error" in result.error
    assert [c.ok for c in calls(result)] == [False]


@pytest.mark.parametrize("provider", PROVIDERS)
@pytest.mark.parametrize("at", [0, 1], ids=["planner", "executor"])
async def test_an_unauthorized_key_stops_the_run_with_the_providers_message(
    provider: str, at: int
) -> None:
    with WireServer(script()) as server:
        server.faults.script([None] * at + ["unauthorized"])
        with pytest.raises(ModelAuthError, match=r"HTTP 401: .*(API key|x-api-key)"):
            await mini_run(server, provider)
        assert server.count() == at + 1


@pytest.mark.parametrize("provider", PROVIDERS)
async def test_retry_after_is_honoured(provider: str) -> None:
    events: list[RunEvent] = []
    with WireServer(script(), retry_after_s=1, retry_after_ms=False) as server:
        server.faults.script(["rate_limit"])
        started = time.perf_counter()
        result = await hierplan.run(
            GOAL,
            model=hierplan.ModelSpec(name=MODELS[provider], **model_options(server, provider)),
            settings=hierplan.RunSettings(retry_backoff_s=0),
            listeners=[events.append],
        )
        elapsed = time.perf_counter() - started
    assert result.status == "succeeded"
    assert elapsed >= 1.0
    retried = [e for e in events if isinstance(e, StepRetried)]
    assert [e.delay_s for e in retried] == [1.0]
    assert "HTTP 429" in retried[0].error


@pytest.mark.parametrize("provider", PROVIDERS)
async def test_a_retry_after_beyond_the_cap_fails_the_call_at_once(provider: str) -> None:
    with WireServer(script(), retry_after_s=30, retry_after_ms=False) as server:
        server.faults.script(["rate_limit"])
        result = await mini_run(server, provider, model_retry_max_delay_s=5)
        assert server.count() == 1
    assert result.status == "failed"
    assert result.error is not None
    assert "asked to wait 30 s, more than model_retry_max_delay_s=5" in result.error


@pytest.mark.parametrize("provider", PROVIDERS)
async def test_a_timed_out_attempt_is_abandoned_after_timeout_s(provider: str) -> None:
    with WireServer(script(), slow_s=3.0) as server:
        server.faults.script(["slow"])
        started = time.perf_counter()
        result = await mini_run(server, provider, timeout_s=0.3)
        elapsed = time.perf_counter() - started
    assert result.status == "succeeded"
    assert elapsed < 2.0  # the 3 s reply was not waited for
    failed = [c for c in calls(result) if not c.ok]
    assert len(failed) == 1 and 0.25 < failed[0].duration_s < 1.5
    # The provider had the request and may bill it: counted at its worst case, not as free.
    assert failed[0].flags == ["no_usage", "failed"]
    assert failed[0].usage.output_tokens == RunSettings().planner_max_tokens
    assert failed[0].usage.input_tokens > 0


@pytest.mark.parametrize("provider", PROVIDERS)
async def test_an_attempt_that_could_not_connect_counts_for_nothing(provider: str) -> None:
    with WireServer(script()) as server:
        base_url = server.base_url(provider)
    # The server has stopped: its port refuses connections, so no request went out.
    result = await hierplan.run(
        GOAL,
        model=hierplan.ModelSpec(
            name=MODELS[provider], **{"base_url": base_url, "api_key": "test-key", "timeout_s": 2.0}
        ),
        settings=hierplan.RunSettings(model_retries=0, transient_retries=0),
    )
    assert result.status == "failed"
    assert result.error is not None and "connection failed" in result.error
    (call,) = calls(result)
    assert (call.ok, call.flags, call.usage.total_tokens) == (False, ["failed"], 0)


@pytest.mark.parametrize("provider", PROVIDERS)
async def test_exhausted_retries_fail_the_node_not_the_process(provider: str) -> None:
    with WireServer(script()) as server:
        server.faults.script(["server_error", "server_error"])
        result = await mini_run(server, provider, model_retries=1, transient_retries=0)
        assert server.count() == 2
    assert result.status == "failed"
    assert result.error is not None and "planning failed" in result.error
    assert "HTTP 500" in result.error


@pytest.mark.parametrize("provider", PROVIDERS)
@pytest.mark.parametrize("at", [0, 1], ids=["planner", "executor"])
async def test_a_call_whose_retries_ran_out_gets_one_more_round_after_a_pause(
    provider: str, at: int
) -> None:
    events: list[RunEvent] = []
    counted = CountingInstrument()
    with WireServer(script()) as server:
        server.faults.script([None] * at + ["server_error", "rate_limit"])
        started = time.perf_counter()
        result = await hierplan.run(
            GOAL,
            model=hierplan.ModelSpec(name=MODELS[provider], **model_options(server, provider)),
            settings=hierplan.RunSettings(
                retry_backoff_s=0, model_retries=1, transient_pause_s=0.5
            ),
            listeners=[events.append],
            instruments=[counted],
        )
        elapsed = time.perf_counter() - started
        hits = server.count()
    assert result.status == "succeeded", result.error
    assert elapsed >= 0.5
    node = [n for n in result.nodes() if n.calls][at]
    assert [(c.attempt, c.ok) for c in node.calls] == [(1, False), (2, False), (3, True)]
    assert node.transient_retries == 1
    assert sum(n.transient_retries for n in result.nodes()) == 1
    # The round's attempt is a call like any other: recorded, and seen by every instrument.
    assert len(calls(result)) == hits == counted.attempts == 4
    paused = [e for e in events if isinstance(e, StepRetried) and e.delay_s == 0.5]
    assert len(paused) == 1 and paused[0].path == node.path
    assert "HTTP 429" in paused[0].error and "one more round after a pause" in paused[0].error
    assert "<b>retried after a pause</b>: 1 call(s)" in render_html(result)


@pytest.mark.parametrize("provider", PROVIDERS)
async def test_a_node_gets_its_extra_round_once(provider: str) -> None:
    with WireServer(script()) as server:
        server.faults.script(["server_error"] * 4)
        result = await mini_run(server, provider, model_retries=1, transient_pause_s=0)
        assert server.count() == 4
    assert result.status == "failed"
    assert result.error is not None and "planning failed" in result.error
    assert result.tree.transient_retries == 1


@pytest.mark.parametrize("provider", PROVIDERS)
async def test_the_pause_before_the_extra_round_honours_retry_after(provider: str) -> None:
    events: list[RunEvent] = []
    with WireServer(script(), retry_after_s=1, retry_after_ms=False) as server:
        server.faults.script(["rate_limit"])
        started = time.perf_counter()
        result = await hierplan.run(
            GOAL,
            model=hierplan.ModelSpec(name=MODELS[provider], **model_options(server, provider)),
            settings=hierplan.RunSettings(retry_backoff_s=0, model_retries=0, transient_pause_s=0),
            listeners=[events.append],
        )
        elapsed = time.perf_counter() - started
    assert result.status == "succeeded", result.error
    assert elapsed >= 1.0
    assert [e.delay_s for e in events if isinstance(e, StepRetried)] == [1.0]
    assert result.tree.transient_retries == 1


@pytest.mark.parametrize("provider", PROVIDERS)
async def test_no_extra_round_for_a_provider_asking_to_wait_past_the_cap(provider: str) -> None:
    with WireServer(script(), retry_after_s=30, retry_after_ms=False) as server:
        server.faults.script(["rate_limit"])
        result = await mini_run(
            server, provider, model_retries=0, model_retry_max_delay_s=5, transient_pause_s=0
        )
        assert server.count() == 1
    assert result.status == "failed"
    assert result.tree.transient_retries == 0


class CountingInstrument(hierplan.Instrument):
    """Wraps every node's model and counts the attempts that pass through (as budgets do)."""

    def __init__(self) -> None:
        self.attempts = 0
        self.failures = 0

    def wrap_model(self, model: Model, node: hierplan.NodeView) -> Model:
        outer = self

        class Counted:
            name, provider = model.name, model.provider
            priced_as, simulated = model.priced_as, model.simulated

            async def request(self, request: ModelRequest) -> ModelResponse:
                outer.attempts += 1
                try:
                    return await model.request(request)
                except ModelError:
                    outer.failures += 1
                    raise

        return Counted()


@pytest.mark.parametrize("provider", PROVIDERS)
async def test_every_attempt_passes_through_the_instruments(provider: str) -> None:
    counter = CountingInstrument()
    with WireServer(script(), slow_s=1.0) as server:
        server.faults.script(["rate_limit", "truncated", None, "malformed"])
        result = await hierplan.run(
            GOAL,
            model=hierplan.ModelSpec(
                name=MODELS[provider], **model_options(server, provider, timeout_s=0.4)
            ),
            settings=hierplan.RunSettings(retry_backoff_s=0),
            instruments=[counter],
        )
        hits = server.count()
    assert result.status == "succeeded"
    assert counter.attempts == hits == len(calls(result)) == 5
    assert counter.failures == 3


@asynccontextmanager
async def closes_counted(monkeypatch: pytest.MonkeyPatch) -> Any:
    closed: list[str] = []
    for cls in (OpenAIModel, AnthropicModel):
        original = cls.aclose

        async def aclose(self: Any, original: Any = original) -> None:
            closed.append(self.name)
            await original(self)

        monkeypatch.setattr(cls, "aclose", aclose)
    yield closed


@pytest.mark.parametrize("provider", PROVIDERS)
async def test_run_closes_the_models_it_opened_whatever_the_outcome(
    provider: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with closes_counted(monkeypatch) as closed:
        with WireServer(script()) as server:
            await mini_run(server, provider)
            assert closed == [MODELS[provider]]
            server.faults.script(["unauthorized"])
            with pytest.raises(ModelAuthError):
                await mini_run(server, provider)
    assert closed == [MODELS[provider]] * 2


async def test_one_client_serves_planner_and_executor_and_given_models_stay_open(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    async with closes_counted(monkeypatch) as closed:
        with WireServer(script()) as server:
            spec = hierplan.ModelSpec(name=MODELS["openai"], **model_options(server, "openai"))
            result = await hierplan.run(GOAL, model=spec, executor_model=spec)
            assert result.status == "succeeded" and closed == [MODELS["openai"]]
            mine = OpenAIModel("gpt-5-mini", api_key="test-key", base_url=server.openai_base_url)
            server.backend.script.extend([Reply(output=PLAN), Reply(text="hello")])  # type: ignore[attr-defined]
            await hierplan.run(GOAL, model=mine)
            assert closed == [MODELS["openai"]]  # the caller's model is the caller's to close
            await mine.aclose()


def test_retry_delay_honours_retry_after_caps_and_jitters() -> None:
    policy = RetryPolicy(backoff_s=1.0, max_delay_s=10)
    plain = ModelError("x", retryable=True)
    for attempt, (low, high) in {1: (0.5, 1.0), 2: (1.0, 2.0), 3: (2.0, 4.0)}.items():
        delays = [policy.delay(attempt, plain) for _ in range(50)]
        assert all(d is not None and low <= d <= high for d in delays)
        assert len(set(delays)) > 1  # jittered
    capped = [policy.delay(10, plain) for _ in range(20)]
    assert all(d is not None and 5.0 <= d <= 10.0 for d in capped)
    asked = ModelError("x", retryable=True, retry_after=7.5)
    assert policy.delay(1, asked) == 7.5
    assert policy.delay(1, ModelError("x", retryable=True, retry_after=11)) is None


async def test_a_gateway_refusing_max_tokens_costs_one_failed_attempt_not_the_run() -> None:
    # A custom base URL gets max_tokens; a gateway in front of OpenAI's gpt-5 models refuses it.
    with WireServer(script(), refused_fields=["max_tokens"]) as server:
        result = await mini_run(server, "openai")
        assert server.count() == 3
    assert result.status == "succeeded" and result.answer == "hello"
    assert [c.ok for c in calls(result)] == [False, True, True]


@pytest.mark.parametrize("provider", PROVIDERS)
async def test_a_plan_cut_at_max_tokens_fails_at_once_naming_planner_max_tokens(
    provider: str,
) -> None:
    cut = Reply(text='a. greet(name="the us', finish="length")
    with WireServer(ScriptBackend([cut])) as server:
        result = await mini_run(server, provider)
        # no repair attempt: it would be asked with the same limit and cut again
        assert server.count() == 1
    assert result.status == "failed"
    assert result.error is not None
    assert "plan for node 1 was cut at the token limit (planner_max_tokens=4096)" in result.error


@pytest.mark.parametrize(
    ("provider", "reply", "reason"),
    [
        ("openai", Reply(refusal="I can't help with that."), "refused to plan: I can't help"),
        ("anthropic", Reply(text="I can't help with that.", finish="refusal"), "refused to plan"),
        ("openai", Reply(finish="content_filter"), "content filter stopped the plan"),
    ],
    ids=["openai-refusal", "anthropic-refusal", "openai-content-filter"],
)
async def test_a_refused_plan_fails_the_node_with_the_reason_and_no_repair(
    provider: str, reply: Reply, reason: str
) -> None:
    with WireServer(ScriptBackend([reply])) as server:
        result = await mini_run(server, provider)
        assert server.count() == 1
    assert result.status == "failed"
    assert result.error is not None and reason in result.error


async def test_a_request_too_large_for_the_rate_limit_fails_without_retries() -> None:
    with WireServer(script()) as server:
        server.faults.script(["too_large"])
        result = await mini_run(server, "openai")
        assert server.count() == 1
    assert result.status == "failed"
    assert result.error is not None and "Request too large" in result.error
    assert "waiting does not help" in result.error


async def test_an_anthropic_refusal_in_a_tool_call_fails_the_step_with_the_explanation() -> None:
    declined = "This request was declined because it could enable cyber harm."
    refused = Reply(
        tool_calls=[("toolu_1", "add", {})],
        raw_arguments='{"a": ',
        finish="refusal",
        refusal=declined,
    )
    replan = Reply(finish="refusal", refusal=declined)  # the root's replan is refused too
    with WireServer(ScriptBackend([Reply(output=PLAN), refused, replan])) as server:
        result = await mini_run(server, "anthropic")
    # the refused call is made once, not retried as a malformed reply (root's calls first)
    assert [(c.purpose, c.ok, c.flags) for c in calls(result)] == [
        ("plan", True, []),
        ("replan", True, ["refusal"]),
        ("execute", True, ["refusal"]),
    ]
    assert result.status == "failed"
    assert result.error is not None and f"the model refused the step: {declined}" in result.error
