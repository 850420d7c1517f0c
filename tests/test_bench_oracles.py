"""Each suite's oracle solves every task under every strategy with the ``ideal`` profile, and
the simulator's noise mechanisms behave as documented (the same for every strategy)."""

from __future__ import annotations

import importlib
import inspect
import io
import random
import tokenize

import pytest

import hierplan
from hierplan.agents.planner import PLAN_SCHEMA
from hierplan.agents.prompts import (
    PLAN_OUTPUT_NAME,
    RUNNING_RESULT,
    PlanPrompt,
    StepPrompt,
    render_plan_prompt,
    render_step_prompt,
)
from hierplan.bench.harness import BenchConfig, plan_runs, run_one, strategies_for
from hierplan.bench.suites import SUITE_NAMES, get_suite
from hierplan.core.settings import STRATEGY_NAMES
from hierplan.models.base import Message, ModelRequest, OutputSchema, ToolCall
from hierplan.plans.plan import Plan, Step
from hierplan.simulator.model import SimulatedModel
from hierplan.simulator.oracle import Action
from hierplan.simulator.profiles import PROFILES, NoiseProfile

IDEAL = BenchConfig(
    suites=SUITE_NAMES,
    strategies=STRATEGY_NAMES,
    tasks=6,
    seeds=1,
    profile=PROFILES["ideal"],
    latency_scale=0.0,
    task_seed=11,
)


@pytest.mark.anyio
@pytest.mark.parametrize("suite", SUITE_NAMES)
async def test_every_oracle_solves_every_task_under_every_strategy(suite: str) -> None:
    specs = [s for s in plan_runs(IDEAL) if s.suite.name == suite]
    assert len(specs) == 6 * len(strategies_for(get_suite(suite), IDEAL))
    failures = []
    for spec in specs:
        record = await run_one(spec, IDEAL, "sim")
        if not record["success"]:
            failures.append((spec.task.task_id, spec.strategy, record["verification"]))
        assert record["simulated"] is True
    assert failures == []


@pytest.mark.anyio
async def test_large_tasks_are_decomposed_by_hierarchical_and_as_needed() -> None:
    suite = get_suite("crafting")
    task = max(suite.generate(30, seed=0), key=lambda t: t.params["reference_actions"])
    depths = {}
    for strategy in ("dag", "hierarchical", "as-needed"):
        env = suite.environment(task, latency_scale=0)
        model = hierplan.Simulator(latency_scale=0, profile="ideal", oracle=suite.oracle())
        result = await hierplan.run(env.goal, tools=env.tools, strategy=strategy, model=model)
        assert env.verify(result.answer).ok
        depths[strategy] = max(n.depth for n in result.nodes())
    assert depths["dag"] == 2
    assert depths["hierarchical"] >= 3  # sub-goals got their own planners


# -- the noise model -------------------------------------------------------------------------


def test_executor_error_grows_with_the_horizon_and_after_an_error() -> None:
    p = PROFILES["typical"]
    first = p.decision_error_probability(0, had_error=False)
    later = p.decision_error_probability(20, had_error=False)
    after = p.decision_error_probability(20, had_error=True)
    assert first == p.executor_error_rate
    assert later == pytest.approx(p.executor_error_rate + 20 * p.executor_error_per_action)
    assert first < later < after
    assert p.decision_error_probability(10_000, had_error=True) == p.max_error_rate
    assert PROFILES["ideal"].decision_error_probability(50, had_error=True) == 0


def test_plan_errors_grow_with_plan_size() -> None:
    p = PROFILES["typical"]
    assert p.plan_error_probability(1) < p.plan_error_probability(10) < p.plan_error_probability(30)
    model = SimulatedModel(None, profile=p)
    rng = random.Random(1)
    small = sum(model._plan_error_count(3, False, rng) for _ in range(2000))
    large = sum(model._plan_error_count(30, False, rng) for _ in range(2000))
    # expected: 2000 * (0.03 + 3 * 0.02) = 180 and 2000 * (0.03 + 30 * 0.02) = 1260
    assert 120 < small < 250
    assert 1100 < large < 1420


class _Counting:
    """An oracle with a fixed answer: ten independent calls, then a final text."""

    def plan(self, prompt: PlanPrompt) -> Plan | None:
        steps = [Step(id=f"s{i}", title="t", instruction="x") for i in range(20)]
        return Plan(goal=prompt.goal, steps=steps)

    def act(self, prompt: StepPrompt, done: object) -> Action | None:
        return Action(tool_calls=tuple(ToolCall("same", "look", {"i": i}) for i in range(10)))


def _step_request(calls_so_far: int, errors: int = 0) -> ModelRequest:
    messages = list(render_step_prompt(StepPrompt("do it")))
    for i in range(calls_so_far):
        call = ToolCall(f"c{i}", "look", {"i": i})
        messages.append(Message("assistant", "", (call,)))
        text = "ERROR: no" if i < errors else "ok"
        messages.append(Message("tool", text, tool_call_id=f"c{i}"))
    return ModelRequest(messages=tuple(messages))


@pytest.mark.anyio
async def test_executor_errors_are_more_frequent_late_and_after_errors() -> None:
    profile = NoiseProfile(
        executor_error_rate=0.05, executor_error_per_action=0.01, executor_error_after_error=0.3,
        max_calls_per_turn=1,
    )  # fmt: skip
    rates = []
    for calls, errors in ((0, 0), (30, 0), (30, 1)):
        wrong = 0
        for seed in range(400):
            model = SimulatedModel(_Counting(), profile=profile, seed=seed, latency_scale=0)
            response = await model.request(_step_request(calls, errors))
            wrong += any(f.startswith("sim_executor_error") for f in response.flags)
        rates.append(wrong / 400)
    # expected about 0.05, 0.35 and 0.5 (the cap)
    assert rates[0] < 0.12
    assert 0.25 < rates[1] < 0.45
    assert rates[2] > rates[1]


@pytest.mark.anyio
async def test_calls_per_turn_cap_and_unique_call_ids() -> None:
    capped = SimulatedModel(_Counting(), profile=NoiseProfile(max_calls_per_turn=3))
    response = await capped.request(_step_request(4))
    assert [c.id for c in response.tool_calls] == ["call_4", "call_5", "call_6"]
    free = SimulatedModel(_Counting(), profile="ideal")
    assert len((await free.request(_step_request(0))).tool_calls) == 10


@pytest.mark.anyio
async def test_latency_has_a_per_token_part() -> None:
    profile = NoiseProfile(latency_per_output_token_s=0.5)
    model = SimulatedModel(_Counting(), profile=profile)
    prompt = PlanPrompt(goal="g", depth=1, max_depth=1, max_steps=50)
    request = ModelRequest(
        messages=render_plan_prompt(prompt, ()),
        output_schema=OutputSchema(PLAN_OUTPUT_NAME, PLAN_SCHEMA),
        max_tokens=4096,
        phase="planning",
    )
    rng = random.Random(0)
    assert model._latency(rng, 10) == pytest.approx(5.0)
    assert SimulatedModel(_Counting(), profile=profile, latency_scale=0)._latency(rng, 10) == 0
    response = await SimulatedModel(_Counting(), profile="ideal").request(request)
    assert response.usage is not None and response.usage.output_tokens > 100


def test_profiles_are_documented_and_ordered() -> None:
    ideal, typical, weak = (PROFILES[n] for n in ("ideal", "typical", "weak"))
    for field in ("plan_error_per_step", "executor_error_rate", "executor_error_per_action",
                  "executor_error_after_error", "latency_median_s"):  # fmt: skip
        assert getattr(ideal, field) == 0
        assert 0 < getattr(typical, field) < getattr(weak, field)
    for field in NoiseProfile.model_fields:
        assert field == "name" or NoiseProfile.model_fields[field].description


@pytest.mark.parametrize(
    "module",
    [
        "hierplan.simulator.model",
        "hierplan.bench.base",
        "hierplan.bench.suites.blocksworld",
        "hierplan.bench.suites.crafting",
        "hierplan.bench.suites.game24",
        "hierplan.bench.suites.parallel_qa",
    ],
)
def test_simulator_and_oracles_cannot_see_the_strategy(module: str) -> None:
    """They read prompt text only: no strategy, policy, request purpose or ReAct flag (the
    simulator seeds its draws by the asking node's path, which carries no strategy)."""
    source = inspect.getsource(importlib.import_module(module))
    names = {
        tok.string
        for tok in tokenize.generate_tokens(io.StringIO(source).readline)
        if tok.type == tokenize.NAME
    }
    forbidden = {"strategy", "strategies", "STRATEGIES", "PlanPolicy", "policy", "purpose",
                 "react"}  # fmt: skip
    assert names & forbidden == set()
    assert "hierplan.hierarchy.strategies" not in source
    assert "hierplan.hierarchy.nodes" not in source


# -- replans: the oracles repair from what the prompt reports --------------------------------


def test_blocksworld_replan_starts_from_the_state_in_the_failure() -> None:
    from hierplan.bench.suites import blocksworld as bw

    task = get_suite("blocksworld").generate(1, seed=4)[0]
    now = bw.World.from_towers([[b] for b, _ in task.data.start.below])  # all on the table
    failure = f"step 'p3' failed: cannot stack x: no. Now: {now.describe('state 7')}"
    prompt = PlanPrompt(goal=task.goal, depth=1, max_depth=1, max_steps=50,
                        current_plan={"goal": task.goal, "steps": []}, failure=failure)  # fmt: skip
    plan = get_suite("blocksworld").oracle().plan(prompt)
    assert plan is not None
    assert all(s.id.startswith("s7_") for s in plan.steps)  # fresh ids: nothing carries over
    actions = [(s.tool, *s.args.values()) for s in plan.steps]  # type: ignore[union-attr]
    assert bw.validate_actions(now, task.data.goal, actions).ok


def test_game24_replan_resets_a_dead_end() -> None:
    goal = get_suite("game24").generate(1)[0].goal  # a solvable puzzle
    failure = "step 'm2' failed: 9 is not in the pool. Now: <pool 3: 1 = (1 - 0); 100 = (10 * 10)>"
    prompt = PlanPrompt(goal=goal, depth=1, max_depth=1, max_steps=50, failure=failure)
    plan = get_suite("game24").oracle().plan(prompt)
    assert plan is not None
    assert plan.steps[0].tool == "reset" and plan.steps[0].id == "r3_reset"
    assert plan.steps[1].depends_on == ["r3_reset"]  # the moves start after the reset


def test_parallel_qa_replan_keeps_done_lookups_and_redoes_a_bad_part() -> None:
    task = max(get_suite("parallel_qa").generate(20, seed=1), key=lambda t: t.params["lookups"])
    oracle = get_suite("parallel_qa").oracle()
    first = oracle.plan(PlanPrompt(goal=task.goal, depth=1, max_depth=3, max_steps=50))
    assert first is not None
    parts = [s for s in first.steps if s.kind == "subgoal"]
    assert parts, "a large question is split into sub-goals"
    progress = {parts[0].id: "c1: 12\nc2: 40"}  # a sub-goal that answered two numbers
    lookups = [s for s in first.steps if s.tool == "lookup"]
    progress |= {s.id: "123" for s in lookups[1:]}
    progress[lookups[0].id] = RUNNING_RESULT  # still running: it is kept like a done one
    replan = oracle.plan(
        PlanPrompt(
            goal=task.goal,
            depth=1,
            max_depth=3,
            max_steps=50,
            current_plan=first.model_dump(mode="json"),
            progress=progress,
            failure="step 'answer' failed: invalid arguments",
        )
    )
    assert replan is not None
    ids = {s.id for s in replan.steps}
    assert {s.id for s in lookups} <= ids  # kept: their results carry over
    assert parts[0].id not in ids and parts[0].id + "r" in ids  # redone under a new id
    answer = replan.steps[-1]
    assert f"${parts[0].id}r" in answer.args.values()  # type: ignore[union-attr]
    assert parts[0].id + "r" in answer.depends_on


def test_crafting_replan_uses_the_reported_inventory() -> None:
    task = get_suite("crafting").generate(1, seed=2)[0]
    oracle = get_suite("crafting").oracle()
    first = oracle.plan(PlanPrompt(goal=task.goal, depth=1, max_depth=1, max_steps=50))
    assert first is not None
    gets = {s.args["item"]: s.args["count"] for s in first.steps if s.tool == "get"}  # type: ignore[index]
    have = ", ".join(f"{n} {item}" for item, n in sorted(gets.items()))
    failure = f"step 'x' failed: cannot craft y. Now: <inventory 9: {have}>"
    replan = oracle.plan(PlanPrompt(goal=task.goal, depth=1, max_depth=1, max_steps=50,
                                    failure=failure))  # fmt: skip
    assert replan is not None
    assert all(s.id.startswith("r9_") for s in replan.steps)
    assert not [s for s in replan.steps if s.tool == "get"]  # everything fetched is there


@pytest.mark.anyio
async def test_noise_is_independent_across_tasks_and_paired_across_strategies() -> None:
    """Each task gets its own simulator seed. With one seed for all, every task would draw the
    same noise at the root, so plans of one size would all break or all hold."""
    profile = NoiseProfile(plan_error_per_step=0.05)
    config = BenchConfig(suites=("blocksworld",), strategies=("plan-execute", "dag"), tasks=40,
                         seeds=1, profile=profile, latency_scale=0.0)  # fmt: skip
    records = [await run_one(spec, config, "sim") for spec in plan_runs(config)]
    flat = [r for r in records if r["strategy"] == "plan-execute"]
    fates: dict[int, set[bool]] = {}
    for r in flat:
        fates.setdefault(r["param_reference_actions"], set()).add(r["success"])
    assert sum(len(f) > 1 for f in fates.values()) >= 3  # same size, different outcomes
    seeds = [r["sim_seed"] for r in flat]
    assert len(set(seeds)) == len(seeds)
    assert seeds == [r["sim_seed"] for r in records if r["strategy"] == "dag"]
