"""The joiner: after a streamed plan's steps finish, one planning call answers the goal or asks
for a replan with the results so far kept. A plan gated whole, or ``join`` off, gets none; a
joiner whose answer does not read, or whose call the budget refuses, leaves the answer the
results make, flagged."""

from __future__ import annotations

from typing import Any

import anyio
import pytest
from hypothesis import given
from hypothesis import strategies as st

import hierplan
from hierplan import RunResult, RunSpec, ScriptedModel, tool
from hierplan.agents.prompts import (
    JoinParseError,
    JoinPrompt,
    parse_join_output,
    parse_join_prompt,
    render_join_prompt,
)
from hierplan.bench.suites import get_suite
from hierplan.core.settings import RunSettings
from hierplan.errors import BudgetExceeded
from hierplan.hierarchy.gate import CallbackApprover, GateContext
from hierplan.models.base import ModelRequest, ModelResponse
from hierplan.models.scripted import StreamedText
from hierplan.plans.decisions import Approve
from hierplan.plans.plan import Plan
from hierplan.records import CallRecord, NodeRecord
from hierplan.simulator.model import SimulatedModel
from hierplan.simulator.profiles import NoiseProfile

pytestmark = pytest.mark.anyio

PLAN = StreamedText(("1. lookup(1)\n", "2. lookup(2)\n"))


class Lookups:
    """A ``lookup`` tool that records the keys it was called with."""

    def __init__(self) -> None:
        self.keys: list[int] = []

        @tool
        def lookup(key: int) -> int:
            """Look a key up."""
            self.keys.append(key)
            return key * 10

        self.tool = lookup


async def run(
    script: list[Any], *, join: bool = True, **options: Any
) -> tuple[RunResult, ScriptedModel, Lookups]:
    lookups = Lookups()
    model = ScriptedModel(script)
    settings = RunSettings(retry_backoff_s=0, join=join, **options.pop("settings", {}))
    spec = RunSpec(goal="look things up", model=model, strategy="dag", settings=settings)
    with anyio.fail_after(20):
        result = await hierplan.run(spec, tools=[lookups.tool], **options)
    model.assert_complete()
    return result, model, lookups


def joins(record: NodeRecord) -> list[CallRecord]:
    return [c for c in record.calls if c.purpose.startswith("join")]


async def test_the_joiners_answer_is_the_nodes_and_its_call_is_planning() -> None:
    result, model, _ = await run([PLAN, ModelResponse(text="ANSWER: ten and twenty")])
    assert result.status == "succeeded"
    assert result.answer == "ten and twenty" == result.tree.output
    (call,) = joins(result.tree)
    assert (call.phase, call.purpose) == ("planning", "join")
    prompt = parse_join_prompt(model.requests[1].messages)
    assert prompt is not None
    assert prompt.results == {"1": "10", "2": "20"}
    assert prompt.draft == "1: 10\n2: 20"  # the answer the results make without a joiner
    assert result.tree.flags == []


async def test_a_replan_the_joiner_asks_for_keeps_the_steps_done() -> None:
    script = [
        PLAN,
        ModelResponse(text="REPLAN: key 3 is missing"),
        ModelResponse(text="1. lookup(1)\n2. lookup(2)\n3. lookup(3)\n"),
        ModelResponse(text="ANSWER: 10, 20 and 30"),
    ]
    result, model, lookups = await run(script)
    assert result.status == "succeeded" and result.answer == "10, 20 and 30"
    assert sorted(lookups.keys) == [1, 2, 3]  # the done lookups did not run again
    assert [v.reason for v in result.tree.plan_versions] == ["initial", "replan"]
    replan_prompt = model.requests[2].messages[1].content
    assert "FAILURE: the joiner asked for a replan: key 3 is missing" in replan_prompt
    assert '"1": "10"' in replan_prompt  # the results so far are in its PROGRESS
    assert [c.purpose for c in joins(result.tree)] == ["join", "join"]


async def test_a_replan_asked_with_no_replans_left_ends_with_the_results() -> None:
    script = [PLAN, ModelResponse(text="REPLAN: not sure")]
    result, _, _ = await run(script, settings={"max_replans": 0})
    assert result.status == "succeeded" and result.answer == "1: 10\n2: 20"
    assert result.tree.flags == ["join_replan_refused"]
    assert len(result.tree.plan_versions) == 1


async def test_a_joiner_answer_that_does_not_read_gets_a_repair() -> None:
    result, model, _ = await run(
        [PLAN, ModelResponse(text="maybe?"), ModelResponse(text="ANSWER: ok")]
    )
    assert result.answer == "ok"
    assert [c.purpose for c in joins(result.tree)] == ["join", "join-repair"]
    assert "REPAIR:" in model.requests[2].messages[-1].content


async def test_a_joiner_that_never_reads_leaves_the_answer_from_the_results() -> None:
    script = [PLAN, ModelResponse(text="maybe?"), ModelResponse(text="REPLAN:")]
    result, _, _ = await run(script)
    assert result.status == "succeeded" and result.answer == "1: 10\n2: 20"
    assert result.tree.flags == ["join_unread"]


async def test_a_join_call_the_budget_refuses_leaves_the_answer_from_the_results() -> None:
    result, _, _ = await run([PLAN, BudgetExceeded("no funds for the joiner")])
    assert result.status == "succeeded" and result.answer == "1: 10\n2: 20"
    assert result.tree.flags == ["join_no_budget"]


async def test_join_off_makes_no_join_call() -> None:
    result, _, _ = await run([PLAN], join=False)
    assert result.answer == "1: 10\n2: 20"
    assert joins(result.tree) == []


async def test_a_plan_gated_whole_gets_no_joiner() -> None:
    def review(plan: Plan, ctx: GateContext) -> Approve:
        return Approve(by="reviewer")

    result, _, _ = await run([PLAN], approver=CallbackApprover(review))
    assert result.answer == "1: 10\n2: 20"
    assert result.tree.plan_versions[0].decided_by == "reviewer"
    assert joins(result.tree) == []


async def test_the_simulator_joins_a_parallel_qa_run() -> None:
    suite = get_suite("parallel_qa")
    task = suite.generate(1, seed=0)[0]
    env = suite.environment(task, latency_scale=0)
    model = hierplan.Simulator(latency_scale=0, profile="ideal", oracle=suite.oracle())
    settings = RunSettings(join=True)
    result = await hierplan.run(
        env.goal, tools=env.tools, strategy="dag", model=model, settings=settings
    )
    assert env.verify(result.answer).ok
    (call,) = joins(result.tree)
    assert call.phase == "planning"


def join_request(draft: str = "42") -> ModelRequest:
    prompt = JoinPrompt(goal="what is it", results={"1": draft}, draft=draft)
    return ModelRequest(
        messages=render_join_prompt(prompt), max_tokens=200, phase="planning", node_path="1"
    )


@pytest.mark.parametrize(
    ("give_up", "starts", "flag"),
    [
        (1.0, "REPLAN:", "sim_join_error:needless_replan"),
        (0.0, "ANSWER:", "sim_join_error:wrong_answer"),
    ],
)
async def test_a_wrong_simulated_join_is_a_needless_replan_or_a_wrong_answer(
    give_up: float, starts: str, flag: str
) -> None:
    profile = NoiseProfile(executor_error_rate=1.0, max_error_rate=1.0, give_up_share=give_up)
    response = await SimulatedModel(_NoJoin(), profile=profile).request(join_request())
    assert response.text.startswith(starts) and response.flags == [flag]
    assert response.text != "ANSWER: 42" and response.simulated


async def test_a_right_simulated_join_answers_with_the_draft_without_an_oracle_join() -> None:
    response = await SimulatedModel(_NoJoin(), profile="ideal").request(join_request("7 apples"))
    assert response.text == "ANSWER: 7 apples" and response.simulated


class _NoJoin:
    """An oracle with no ``join``: the joiner answers with the draft."""

    def plan(self, prompt: Any) -> None:
        return None

    def act(self, prompt: Any, done: Any) -> None:
        return None


@given(st.text())
def test_any_joiner_text_parses_or_raises_the_parse_error(text: str) -> None:
    try:
        decision = parse_join_output(text)
    except JoinParseError:
        return
    assert decision.kind in ("answer", "replan") and decision.text.strip()


@given(st.sampled_from(["ANSWER: ", "REPLAN: "]), st.text(min_size=1).filter(str.strip))
def test_a_decision_line_reads_back(head: str, body: str) -> None:
    body = " ".join(body.split())
    decision = parse_join_output(head + body)
    assert decision.kind == head[:-2].lower() and decision.text == body
