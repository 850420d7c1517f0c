"""Reservations that hold against the provider's own count.

An OpenAI-format server on 127.0.0.1 counts every request's input at three times hierplan's
four-characters-a-token estimate and bills every reply's output at the ``max_tokens`` the call
was sent with (hidden reasoning included). Under the default reservation a run's spend stays
within its budget whatever the run does; reserved by the estimate, the same runs overshoot.

The texts mix ASCII with CJK and emoji: three and four UTF-8 bytes a character, which the
estimate counts a token each. (A two-byte character counted three times would be more tokens
than bytes, which no byte-level tokenizer makes: such a server would not be a tokenizer.)
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import anyio
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from wire import MODELS, Reply, WireCall, WireServer, model_options, plan_reply

import hierplan
from hierplan.agents.prompts import parse_plan_prompt, parse_step_prompt
from hierplan.errors import BudgetTooSmall
from hierplan.models.base import ModelRequest, OutputSchema, ToolSpec
from hierplan.models.tokens import estimate_request_tokens
from hierplan.records import RunResult
from hierplan.units import usd_to_pico

FAST_EXAMPLES = 12
SLOW_EXAMPLES = 1_000
INPUT_FACTOR = 3


def provider_count(call: WireCall) -> int:
    """The server's count of a request's input: three times the estimate of what it carries."""
    tools = tuple(
        ToolSpec(f["name"], f.get("description", ""), f.get("parameters", {}))
        for f in (t["function"] for t in call.body.get("tools", []))
    )
    schema = None if call.schema is None else OutputSchema(call.schema_name or "", call.schema)
    request = ModelRequest(messages=tuple(call.messages), tools=tools, output_schema=schema)
    return INPUT_FACTOR * estimate_request_tokens(request)


@dataclass
class Stress:
    """Answers a goal of ``n`` parts: a plan of ``n`` parallel steps, each calling ``echo`` once
    with its filler, then answering. Input counted three times over, output billed in full."""

    fillers: dict[str, str] = field(default_factory=dict)
    calls: int = 0

    def answer(self, call: WireCall) -> Reply:
        self.calls += 1
        billed_in, billed_out = provider_count(call), call.max_tokens or 1
        if call.planning:
            prompt = parse_plan_prompt(call.messages)
            assert prompt is not None
            parts = int(prompt.goal.split()[1])
            steps = [
                {"id": f"p{i}", "title": f"part {i}", "instruction": f"Do part {i}", "tool": "echo"}
                for i in range(parts)
            ]
            reply = plan_reply(call, {"goal": prompt.goal, "steps": steps})
            reply.input_tokens, reply.output_tokens = billed_in, billed_out
            return reply
        step = parse_step_prompt(call.messages)
        assert step is not None
        if not any(m.role == "tool" for m in call.messages):
            text = self.fillers.get(step.instruction, "")
            return Reply(
                tool_calls=[("call_1", "echo", {"text": text})],
                input_tokens=billed_in,
                output_tokens=billed_out,
            )
        return Reply(
            text=f"done {step.instruction}", input_tokens=billed_in, output_tokens=billed_out
        )


@hierplan.tool
def echo(text: str) -> str:
    """Say the text back."""
    return text


alphabet = st.sampled_from([*"abcdefgh 0123456789,;:{}\n", "数", "据", "迁", "移", "🙂", "🚀"])
fillers = st.text(alphabet, max_size=400)


@dataclass(frozen=True)
class Case:
    parts: int
    texts: tuple[str, ...]
    tokens: int | None
    usd: float | None
    planner_max_tokens: int
    executor_max_tokens: int
    concurrency: int


cases = st.builds(
    Case,
    parts=st.integers(1, 8),
    texts=st.lists(fillers, min_size=8, max_size=8).map(tuple),
    tokens=st.none() | st.integers(500, 40_000),
    usd=st.none() | st.floats(0.0005, 0.02),
    planner_max_tokens=st.integers(64, 2_000),
    executor_max_tokens=st.integers(32, 600),
    concurrency=st.integers(1, 8),
)


async def run_case(server: WireServer, stress: Stress, case: Case, reservation: str) -> RunResult:
    goal = f"Parts {case.parts} of the stress goal"
    for i, text in enumerate(case.texts[: case.parts]):
        stress.fillers[f"Do part {i}"] = text
    tokens = case.tokens if case.tokens is not None or case.usd is not None else 5_000
    return await hierplan.run(
        goal,
        model=hierplan.ModelSpec(name=MODELS["openai"], **model_options(server, "openai")),
        strategy="dag",
        tools=[echo],
        settings=hierplan.RunSettings(
            concurrency=case.concurrency,
            planner_max_tokens=case.planner_max_tokens,
            executor_max_tokens=case.executor_max_tokens,
            model_retries=0,
            max_replans=0,
            max_retries=0,
        ),
        budget={"tokens": tokens, "usd": case.usd, "reservation": reservation},
    )


def check_within(result: RunResult, case: Case) -> None:
    assert result.budget is not None
    spent = result.budget["spent"]
    if case.tokens is not None:
        assert spent["tokens"] <= case.tokens, (spent, case)
    if case.usd is not None:
        assert spent["pico"] <= usd_to_pico(case.usd), (spent, case)
    assert result.budget["overrun"]["tokens"] == 0
    # the server's own count is what was settled
    recorded = sum(c.usage.input_tokens for n in result.nodes() for c in n.calls)
    assert recorded > 0 or not any(n.calls for n in result.nodes())


@pytest.fixture(scope="module")
def stress_server() -> Iterator[tuple[WireServer, Stress]]:
    stress = Stress()
    with WireServer(stress) as server:
        yield server, stress


def _property(examples: int) -> Callable[[tuple[WireServer, Stress]], None]:
    def test(stress_server: tuple[WireServer, Stress]) -> None:
        server, stress = stress_server

        @settings(
            max_examples=examples,
            deadline=None,
            suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
        )
        @given(case=cases)
        def spend_stays_within(case: Case) -> None:
            try:
                result = anyio.run(run_case, server, stress, case, "exact")
            except BudgetTooSmall as exc:
                # Too small for the first call: refused before it was sent, at no cost.
                event("too small to start")
                assert "The smallest budget that starts this run is" in str(exc)
                return
            check_within(result, case)

        spend_stays_within()

    return test


test_the_default_reservation_holds_against_a_provider_counting_three_times_more = _property(
    FAST_EXAMPLES
)
test_the_default_reservation_holds_over_a_thousand_runs = pytest.mark.slow(_property(SLOW_EXAMPLES))


# Enough for the planning call as the estimate counts it, and for an overshoot past it.
BUDGET = 4_000


def test_reserved_by_the_estimate_the_same_run_overshoots(
    stress_server: tuple[WireServer, Stress],
) -> None:
    """The contrast that shows the check can fail: the estimate undercounts this server's
    input threefold, and the run spends past its budget (every overrun flagged)."""
    server, stress = stress_server
    case = Case(
        parts=8,
        texts=("数据迁移🚀 0123456789;" * 12,) * 8,
        tokens=BUDGET,
        usd=None,
        planner_max_tokens=400,
        executor_max_tokens=64,
        concurrency=8,
    )
    overshot = anyio.run(run_case, server, stress, case, "estimate")
    assert overshot.budget is not None
    assert overshot.budget["spent"]["tokens"] > BUDGET
    assert overshot.budget["overrun"]["tokens"] > 0
    held = anyio.run(run_case, server, stress, case, "exact")
    check_within(held, case)
    assert json.dumps(held.budget)  # the record is plain data
