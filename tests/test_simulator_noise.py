"""The simulator's noise is the same for the same decision whoever makes it, reaches repairs,
grows after a failure, and follows every knob of the profile.

The statistical tests draw many seeded answers and compare rates with what the profile says,
within a tolerance of Z standard deviations of the binomial count: with fixed seeds they are
deterministic, and the tolerance keeps them from depending on the seeds chosen.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hierplan.agents.planner import PLAN_SCHEMA
from hierplan.agents.prompts import (
    ATTEMPT_FAILED,
    PLAN_INVALID,
    PLAN_OUTPUT_NAME,
    PLAN_REJECTED,
    REPAIR_PREFIX,
    PlanPrompt,
    StepPrompt,
    parse_plan_prompt,
    render_plan_prompt,
    render_step_prompt,
    reports_failure,
)
from hierplan.models.base import Message, ModelRequest, ModelResponse, OutputSchema, ToolCall
from hierplan.plans.plan import Plan, Step
from hierplan.simulator.model import SimulatedModel, corrupt_answer, corrupt_step_args
from hierplan.simulator.oracle import Action
from hierplan.simulator.profiles import NoiseProfile

pytestmark = pytest.mark.anyio

Z = 4.5  # a false alarm about once in 300,000 comparisons
N = 1200  # seeded draws per rate
STEPS = 12


def _close(count: int, n: int, p: float) -> bool:
    """Whether ``count`` of ``n`` draws fits a rate ``p``."""
    return abs(count / n - p) <= Z * math.sqrt(p * (1 - p) / n) + 1 / n


class _Fixed:
    """An oracle with fixed answers: a plan of direct tool steps, and one tool call (or a
    final ``answer``) for any step."""

    def __init__(self, answer: str | None = None) -> None:
        self.answer = answer

    def plan(self, prompt: PlanPrompt) -> Plan | None:
        steps = [
            Step(id=f"s{i}", title="t", instruction="x", tool="look", args={"i": i})
            for i in range(STEPS)
        ]
        return Plan(goal=prompt.goal, steps=steps)

    def act(self, prompt: StepPrompt, done: Sequence[tuple[ToolCall, str]]) -> Action | None:
        if self.answer is not None:
            return Action(text=self.answer)
        return Action(tool_calls=(ToolCall("c", "look", {"i": 99}),))


def _plan_request(
    failure: str | None = None, feedback: str | None = None, repair_after: int = 0
) -> ModelRequest:
    """A planning request; ``repair_after`` steps: a repair of an answer of that many steps."""
    prompt = PlanPrompt(
        goal="g", depth=1, max_depth=1, max_steps=50, failure=failure, feedback=feedback
    )
    messages = render_plan_prompt(prompt, ())
    if repair_after:
        answer = "\n".join(f"{i}. look({i})" for i in range(1, repair_after + 1))
        repair = f"{REPAIR_PREFIX} that plan was invalid: x. Answer again."
        messages = (*messages, Message("assistant", answer), Message("user", repair))
    return ModelRequest(
        messages=messages,
        output_schema=OutputSchema(PLAN_OUTPUT_NAME, PLAN_SCHEMA),
        max_tokens=8192,
        phase="planning",
    )


def _step_request(calls_so_far: int, errors: int = 0) -> ModelRequest:
    """An executor request after ``calls_so_far`` tool calls, the first ``errors`` failed."""
    messages = list(render_step_prompt(StepPrompt("do it")))
    for i in range(calls_so_far):
        call = ToolCall(f"c{i}", "look", {"i": i})
        messages.append(Message("assistant", "", (call,)))
        text = "ERROR: no" if i < errors else "ok"
        messages.append(Message("tool", text, tool_call_id=f"c{i}"))
    return ModelRequest(messages=tuple(messages))


async def _answers(
    profile: NoiseProfile, request: ModelRequest, oracle: _Fixed | None = None, n: int = N
) -> list[ModelResponse]:
    out = []
    for seed in range(n):
        model = SimulatedModel(oracle or _Fixed(), profile=profile, seed=seed, latency_scale=0)
        out.append(await model.request(request))
    return out


def _plan_step_wrong(responses: list[ModelResponse], index: int) -> tuple[int, int]:
    """How many answers wrote step ``index`` with wrong arguments, of those that kept it (a
    structural error may drop it: the draws are independent)."""
    wrong = kept = 0
    for r in responses:
        assert r.output is not None
        step = next((s for s in r.output["steps"] if s["id"] == f"s{index}"), None)
        if step is not None:
            kept += 1
            wrong += step["args"] != {"i": index}
    return wrong, kept


# -- 1. a plan's tool step is as likely wrong as an executor's call at the same horizon -------

SAME = NoiseProfile(
    executor_error_rate=0.08,
    executor_error_per_action=0.02,
    executor_error_after_error=0.25,
    max_error_rate=1.0,
    give_up_share=0.3,
)


@pytest.mark.parametrize(("horizon", "had_error"), [(0, False), (6, False), (6, True)])
async def test_plan_steps_and_executor_calls_have_the_same_wrong_argument_rate(
    horizon: int, had_error: bool
) -> None:
    expected = SAME.wrong_args_probability(horizon, had_error)
    failure = "step 's0' failed: ERROR: no" if had_error else None
    planned, kept = _plan_step_wrong(await _answers(SAME, _plan_request(failure)), horizon)
    acted = await _answers(SAME, _step_request(horizon, errors=int(had_error)))
    executed = sum("sim_executor_error:wrong_args" in r.flags for r in acted)
    assert kept > N / 2
    assert _close(planned, kept, expected), (planned, kept, expected)
    assert _close(executed, N, expected), (executed, expected)
    spread = Z * math.sqrt(expected * (1 - expected) * (1 / N + 1 / kept))
    assert abs(planned / kept - executed / N) <= spread


async def test_a_plan_step_has_wrong_arguments_and_nothing_else_from_the_decision() -> None:
    """Only the arguments change, and only those of direct tool steps; a reference to another
    step's result points to another step it depends on (a wrong value that runs)."""
    always = NoiseProfile(executor_error_rate=1.0, max_error_rate=1.0, give_up_share=0.0)
    response = (await _answers(always, _plan_request(), n=1))[0]
    assert response.output is not None
    steps = response.output["steps"]
    assert [s["id"] for s in steps] == [f"s{i}" for i in range(STEPS)]
    assert all(s["args"] != {"i": i} for i, s in enumerate(steps))
    assert response.flags.count("sim_plan_error:wrong_args") == STEPS
    add = Step(
        id="c", title="t", instruction="x", tool="add", args={"a": "$x", "b": "$y"},
        depends_on=["x", "y"],
    )  # fmt: skip
    for seed in range(20):
        args = corrupt_step_args(add, random.Random(seed))
        assert sorted(args.values()) in (["$x", "$x"], ["$y", "$y"])


async def test_done_steps_a_replan_keeps_are_not_written_and_not_decisions() -> None:
    always = NoiseProfile(  # before and after a failure (the replan reports one)
        executor_error_rate=1.0, executor_error_after_error=1.0, max_error_rate=1.0,
        give_up_share=0.0,
    )  # fmt: skip
    current = _Fixed().plan(PlanPrompt(goal="g", depth=1, max_depth=1, max_steps=50))
    assert current is not None
    prompt = PlanPrompt(
        goal="g", depth=1, max_depth=1, max_steps=50,
        current_plan=current.model_dump(mode="json"), progress={"s0": "1", "s1": "2"},
        failure="step 's2' failed: no",
    )  # fmt: skip
    request = ModelRequest(
        messages=render_plan_prompt(prompt, ()),
        output_schema=OutputSchema(PLAN_OUTPUT_NAME, PLAN_SCHEMA),
        max_tokens=8192,
        phase="planning",
    )
    response = (await _answers(always, request, n=1))[0]
    assert response.output is not None
    steps = response.output["steps"]
    assert [s["id"] for s in steps] == [f"s{i}" for i in range(2, STEPS)]  # done: not written
    assert all(s["args"] != {"i": i} for i, s in enumerate(steps, start=2))  # each a decision


# -- 2. repairs get noise, at the horizon of what they follow --------------------------------


async def test_repairs_get_noise() -> None:
    structural = NoiseProfile(plan_error_rate=1.0)
    repaired = await _answers(structural, _plan_request(repair_after=3), n=20)
    assert all(any(f.startswith("sim_plan_error:") for f in r.flags) for r in repaired)
    # A decision's rate counts the steps of the answer the repair follows as made before.
    growing = NoiseProfile(executor_error_per_action=0.05, max_error_rate=1.0, give_up_share=0.0)
    assert _plan_step_wrong(await _answers(growing, _plan_request()), 0) == (0, N)
    wrong, kept = _plan_step_wrong(await _answers(growing, _plan_request(repair_after=6)), 0)
    assert _close(wrong, kept, growing.wrong_args_probability(6, had_error=False))


# -- 3. planner errors grow after a failure ---------------------------------------------------

AFTER = NoiseProfile(
    executor_error_rate=0.0, executor_error_after_error=0.4, max_error_rate=1.0,
    give_up_share=0.5,
)  # fmt: skip


@pytest.mark.parametrize(
    ("failure", "feedback", "rate"),
    [
        (None, None, 0.0),
        ("step 's1' failed: boom", None, 0.2),
        (None, f"{ATTEMPT_FAILED} (boom); decompose it into smaller steps.", 0.2),
        (None, "Every step of the plan is done, but it left out: x.", 0.0),
    ],
)
async def test_a_planning_prompt_reporting_a_failure_uses_the_after_error_rate(
    failure: str | None, feedback: str | None, rate: float
) -> None:
    responses = await _answers(AFTER, _plan_request(failure, feedback), n=600)
    wrong, kept = _plan_step_wrong(responses, 0)
    assert kept > 200
    assert _close(wrong, kept, rate), (wrong, kept, rate)


def test_what_reports_a_failure() -> None:
    def reports(**kwargs: str) -> bool:
        messages = render_plan_prompt(PlanPrompt("g", 1, 1, 50, **kwargs), ())  # type: ignore[arg-type]
        prompt = parse_plan_prompt(messages)
        assert prompt is not None
        return reports_failure(messages, prompt)

    assert not reports()
    assert reports(failure="step 'a' failed")
    for head in (ATTEMPT_FAILED, PLAN_REJECTED, PLAN_INVALID):
        assert reports(feedback=f"{head}: why")
    assert not reports(feedback="Every step of the plan is done, but it left out: x.")
    repair = _plan_request(repair_after=2)
    prompt = parse_plan_prompt(repair.messages)
    assert prompt is not None and reports_failure(repair.messages, prompt)


async def test_structural_plan_errors_grow_after_a_failure() -> None:
    profile = NoiseProfile(
        plan_error_per_step=0.02, executor_error_rate=0.03, executor_error_after_error=0.10
    )
    assert profile.plan_step_error_probability(True) == pytest.approx(0.09)
    n = 600
    for failure, per_step in ((None, 0.02), ("step 's1' failed", 0.09)):
        responses = await _answers(profile, _plan_request(failure), n=n)
        errors = sum(f == "sim_plan_error:dropped_step" for r in responses for f in r.flags)
        # about STEPS * per_step a plan (a step can be dropped at most STEPS - 1 times)
        mean, sd = STEPS * per_step, math.sqrt(STEPS * per_step * (1 - per_step))
        assert abs(errors / n - mean) <= Z * sd / math.sqrt(n), (errors, mean)


# -- 4. the give-up share, and every knob -----------------------------------------------------


@pytest.mark.parametrize("share", [0.0, 0.3, 1.0])
async def test_a_wrong_final_answer_gives_up_only_at_the_give_up_share(share: float) -> None:
    profile = NoiseProfile(executor_error_rate=1.0, max_error_rate=1.0, give_up_share=share)
    responses = await _answers(profile, _step_request(2), _Fixed(answer="42"), n=600)
    gave_up = [r for r in responses if "sim_executor_error:gave_up" in r.flags]
    wrong = [r for r in responses if "sim_executor_error:wrong_answer" in r.flags]
    assert len(gave_up) + len(wrong) == 600
    assert _close(len(gave_up), 600, share)
    assert all(r.text.startswith("FAILED:") for r in gave_up)
    assert all(r.text != "42" and float(r.text) != 42 for r in wrong)


async def test_a_wrong_tool_call_gives_up_only_at_the_give_up_share() -> None:
    profile = NoiseProfile(executor_error_rate=1.0, max_error_rate=1.0, give_up_share=0.0)
    responses = await _answers(profile, _step_request(0), n=200)
    assert all(r.flags == ["sim_executor_error:wrong_args"] for r in responses)
    assert all(r.tool_calls[0].arguments != {"i": 99} for r in responses)


async def test_executor_rates_follow_the_profile() -> None:
    """executor_error_rate, executor_error_after_error and max_error_rate, through the model."""
    for profile, request, expected in (
        (NoiseProfile(executor_error_rate=0.2), _step_request(3), 0.2),
        (NoiseProfile(executor_error_after_error=0.3), _step_request(3, errors=1), 0.3),
        (NoiseProfile(executor_error_rate=1.0, max_error_rate=0.25), _step_request(0), 0.25),
    ):
        responses = await _answers(profile, request, n=600)
        wrong = sum(any(f.startswith("sim_executor_error") for f in r.flags) for r in responses)
        assert _close(wrong, 600, expected), (wrong, expected)


def test_latency_is_a_log_normal_time_to_first_token_plus_time_per_token() -> None:
    fixed = SimulatedModel(_Fixed(), profile=NoiseProfile(latency_median_s=0.8))
    assert fixed._latency(random.Random(0), 100) == pytest.approx(0.8)
    spread = NoiseProfile(latency_median_s=0.8, latency_sigma=0.5, latency_per_output_token_s=0.01)
    model = SimulatedModel(_Fixed(), profile=spread)
    rng = random.Random(0)
    logs = sorted(math.log(model._latency(rng, 0) / 0.8) for _ in range(4000))
    median = logs[len(logs) // 2]
    sd = math.sqrt(sum(x * x for x in logs) / len(logs))
    assert abs(median) < 0.05  # the median is latency_median_s
    assert sd == pytest.approx(0.5, rel=0.05)  # the log-normal spread is latency_sigma
    with_tokens = [model._latency(random.Random(s), 200) for s in range(50)]
    without = [model._latency(random.Random(s), 0) for s in range(50)]
    assert all(a - b == pytest.approx(2.0) for a, b in zip(with_tokens, without, strict=True))


async def test_verbosity_is_hidden_reasoning() -> None:
    answers = {}
    for verbosity in (0.0, 2.0):
        profile = NoiseProfile(verbosity=verbosity)
        response = (await _answers(profile, _plan_request(), n=1))[0]
        assert response.usage is not None
        answers[verbosity] = response
    quiet, verbose = answers[0.0], answers[2.0]
    assert quiet.usage is not None and verbose.usage is not None
    assert quiet.usage.reasoning_tokens == 0
    assert verbose.text == quiet.text  # not shown in the answer
    visible = quiet.usage.output_tokens
    # 0.5x to 1.5x of twice the answer, counted as output
    assert visible <= verbose.usage.reasoning_tokens <= 3 * visible + 10
    assert verbose.usage.output_tokens == visible + verbose.usage.reasoning_tokens


@given(st.text(max_size=200), st.integers(0, 2**32))
def test_a_corrupted_answer_differs_from_the_answer(text: str, seed: int) -> None:
    assert corrupt_answer(text, random.Random(seed)) != text
