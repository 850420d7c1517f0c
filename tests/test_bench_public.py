"""The public task sets: PlanBench's Blocksworld instances and Tree of Thoughts' Game of 24,
shipped with their licences; the PDDL reader and plan validator; their oracles and settings."""

from __future__ import annotations

import csv
import io
import json
import random
import re
from fractions import Fraction
from importlib import resources
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from hierplan.agents.prompts import PlanPrompt
from hierplan.bench.base import ActionFailed
from hierplan.bench.harness import BenchConfig, load_results, plan_runs, run_bench, run_one
from hierplan.bench.suites import blocksworld as bw
from hierplan.bench.suites import game24 as g24
from hierplan.bench.suites import get_suite, pddl, tot24
from hierplan.bench.suites import planbench as pb
from hierplan.cli import app
from hierplan.models.base import ModelRequest, ModelResponse
from hierplan.models.scripted import FunctionModel, plan_response
from hierplan.plans.plan import Plan, Step
from hierplan.simulator.profiles import PROFILES

DATA = resources.files("hierplan.bench") / "data"


def test_the_shipped_sets_keep_their_licence_and_attribution() -> None:
    for folder, author in (("planbench_blocksworld", "Valmeekam"), ("tot_game24", "Shunyu Yao")):
        assert "MIT License" in (DATA / folder / "LICENSE").read_text()
        assert author in (DATA / folder / "LICENSE").read_text()
        assert "commit" in (DATA / folder / "SOURCE.md").read_text()
    assert len(pb.load_instances()) == 501
    assert [i.number for i in pb.load_instances()] == list(range(1, 502))
    assert get_suite("planbench").source and get_suite("tot24").source


def test_the_tot_test_split_is_exactly_ranks_901_to_1000_of_the_csv() -> None:
    rows = list(csv.DictReader(io.StringIO((DATA / "tot_game24" / "24.csv").read_text())))
    assert len(rows) == 1362
    expected = [(int(r["Rank"]), r["Puzzles"]) for r in rows if 901 <= int(r["Rank"]) <= 1000]
    tasks = get_suite("tot24").generate(10_000)
    assert [(t.params["rank"], t.params["numbers"]) for t in tasks] == expected
    assert len(tasks) == 100 and tasks[0].name == "4 5 6 10 (rank 901)"
    assert len(get_suite("tot24", "all").generate(10_000)) == 1362
    assert get_suite("tot24", "all").generate(3)[0].params["rank"] == 1


def test_a_task_seed_samples_a_public_set_and_seed_0_keeps_its_order() -> None:
    suite = get_suite("planbench")
    assert [t.name for t in suite.generate(3)] == [
        "instance-1.pddl",
        "instance-2.pddl",
        "instance-3.pddl",
    ]
    sample = [t.name for t in suite.generate(5, seed=7)]
    assert sample == [t.name for t in suite.generate(5, seed=7)]
    assert sample != [t.name for t in suite.generate(5)] and len(set(sample)) == 5
    assert sample[:3] == [t.name for t in suite.generate(3, seed=7)]


def test_every_tot24_puzzle_is_solved_by_the_24_solver() -> None:
    for puzzle in tot24.load_puzzles():
        moves = g24.solve([Fraction(n) for n in puzzle.numbers])
        assert moves is not None, puzzle.name


# -- PDDL ---------------------------------------------------------------------------------------


def test_the_domain_is_read_as_its_four_operators() -> None:
    domain = pb.load_domain()
    assert set(domain.operators) == {"pick-up", "put-down", "stack", "unstack"}
    stack = domain.operators["stack"]
    assert stack.parameters == ("?ob", "?underob")
    assert stack.precondition == (("clear", "?underob"), ("holding", "?ob"))
    assert ("on", "?ob", "?underob") in stack.add and ("holding", "?ob") in stack.delete


def test_an_instance_is_read_with_its_init_and_goal() -> None:
    problem = pb.load_instances()[0].problem
    assert problem.objects == ("a", "b", "c", "d")
    assert ("on", "b", "c") in problem.init and ("handempty",) in problem.init
    assert problem.goal == (("on", "c", "b"),)


INSTANCE_1 = "(unstack b c)\n(put-down b)\n(pick-up c)\n(stack c b)\n"


def test_the_validator_accepts_a_plan_written_as_planbench_writes_it() -> None:
    problem = pb.load_instances()[0].problem
    plan = pddl.parse_plan(INSTANCE_1)
    assert plan[0] == ("unstack", ("b", "c"))
    verdict = pddl.validate_plan(pb.load_domain(), problem, plan)
    assert verdict.ok, verdict.summary


@pytest.mark.parametrize(
    ("plan", "reason"),
    [
        ("(pick-up b)", "action 1 is invalid: (pick-up b): precondition (ontable b) does not hold"),
        ("(unstack b c)\n(pick-up a)", "precondition (handempty) does not hold"),
        ("(stack c b)", "precondition (holding c) does not hold"),
        ("(fly b)", "no action 'fly'"),
        ("(unstack b z)", "no object 'z'"),
        ("(unstack b)", "takes 2 argument(s), got 1"),
        ("(unstack b c)\n(put-down b)", "goal not reached after 2 actions; missing: (on c b)"),
        ("", "goal not reached after 0 actions"),
    ],
)
def test_the_validator_refuses_each_kind_of_bad_plan(plan: str, reason: str) -> None:
    problem = pb.load_instances()[0].problem
    verdict = pddl.validate_plan(pb.load_domain(), problem, pddl.parse_plan(plan))
    assert not verdict.ok
    assert reason in verdict.summary


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("(define (domain d)", "1 '(' left open"),
        ("(define (domain d)))", "closes nothing"),
        ("(define (problem p) (:domain d))", "has no :init, :goal"),
        ("(define (domain d) (:predicates (p)))", "defines no action"),
        (
            "(define (domain d) (:action a :parameters () :precondition (not (p)) :effect (p)))",
            "negative preconditions are not STRIPS",
        ),
    ],
)
def test_pddl_it_cannot_read_is_refused_with_a_reason(text: str, message: str) -> None:
    reader = pddl.parse_problem if "problem" in text else pddl.parse_domain
    with pytest.raises(pddl.PDDLError, match=re.escape(message)):
        reader(text)


ACTIONS = st.lists(
    st.tuples(
        st.sampled_from(["pick_up", "put_down", "stack", "unstack"]),
        st.sampled_from("abcde"),
        st.sampled_from("abcde"),
    ),
    max_size=12,
)


@settings(max_examples=200, deadline=None)
@given(number=st.integers(0, 500), actions=ACTIONS)
def test_the_pddl_validator_and_the_blocksworld_rules_agree(
    number: int, actions: list[tuple[str, str, str]]
) -> None:
    """Two independent readings of the same four operators: the domain's PDDL executed, and
    the hand-written rules of the generated suite. Every action succeeds or fails alike, and
    leaves the same towers."""
    instance = pb.load_instances()[number]
    state = instance.problem.init
    world = pb.world_of(state)
    for name, x, y in actions:
        action: bw.BlockAction = (name, x, y) if name in ("stack", "unstack") else (name, x)
        try:
            world_after = bw.apply(world, action)
        except ActionFailed:
            world_after = None
        try:
            state_after = pddl.apply(
                pb.load_domain(), instance.problem.objects, state, pb.to_pddl(action)
            )
        except ActionFailed:
            state_after = None
        assert (world_after is None) == (state_after is None), (action, world.describe("now"))
        if world_after is None or state_after is None:
            continue
        assert pb.world_of(state_after) == world_after
        world, state = world_after, state_after


def test_the_oracle_solves_all_501_instances_by_the_validator() -> None:
    oracle = get_suite("planbench").oracle()
    domain = pb.load_domain()
    for task in get_suite("planbench").generate(501):
        plan = oracle.plan(PlanPrompt(goal=task.goal, depth=1, max_depth=1, max_steps=50))
        assert plan is not None, task.name
        actions = [pb.to_pddl((s.tool or "", *(s.args or {}).values())) for s in plan.steps]
        assert pddl.validate_plan(domain, task.data.problem, actions).ok, task.name


# -- runs ------------------------------------------------------------------------------------

IDEAL = BenchConfig(
    suites=("planbench", "planbench_oneshot", "tot24"),
    strategies=("react", "plan-execute", "dag", "hierarchical"),
    tasks=3,
    seeds=1,
    profile=PROFILES["ideal"],
    latency_scale=0.0,
    task_seed=5,
)


@pytest.mark.anyio
async def test_every_strategy_solves_sampled_tasks_of_both_sets_with_the_ideal_profile() -> None:
    failures = []
    specs = plan_runs(IDEAL)
    assert {s.strategy for s in specs if s.suite.name == "planbench_oneshot"} == {"plan-execute"}
    for spec in specs:
        record = await run_one(spec, IDEAL, "sim")
        if record["outcome"] != "success":
            failures.append((spec.run_id, record["verification"]))
    assert failures == []


@pytest.mark.slow
def test_every_strategy_solves_every_task_of_both_sets_with_the_ideal_profile(
    tmp_path: Path,
) -> None:
    """All 501 PlanBench instances (both settings) and the whole ToT test split, as the command
    line runs them: 2,905 runs, some minutes on two cores."""
    out = tmp_path / "all"
    args = ["bench", "--suite", "planbench,planbench_oneshot,tot24", "--strategies",
            "react,plan-execute,dag,hierarchical", "--tasks", "all", "--seeds", "1",
            "--sim-profile", "ideal", "--sim-latency-scale", "0", "--no-plot",
            "--out", str(out)]  # fmt: skip
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    records = load_results(out / "results.jsonl")
    counts: dict[str, int] = {}
    for r in records:
        counts[r["suite"]] = counts.get(r["suite"], 0) + 1
    assert counts == {"planbench": 501 * 4, "planbench_oneshot": 501, "tot24": 100 * 4}
    failed = [(r["suite"], r["task_name"], r["strategy"]) for r in records if not r["success"]]
    assert failed == []


def test_rows_name_their_tasks_as_the_public_sets_do(tmp_path: Path) -> None:
    out = tmp_path / "p"
    result = CliRunner().invoke(app, ["bench", "--suite", "planbench,tot24", "--strategies",
                                      "react,dag", "--tasks", "2", "--seeds", "1",
                                      "--sim-profile", "ideal", "--sim-latency-scale", "0",
                                      "--no-plot", "--out", str(out)])  # fmt: skip
    assert result.exit_code == 0, result.output
    names = {(r["suite"], r["task_name"]) for r in load_results(out / "results.jsonl")}
    assert names == {
        ("planbench", "instance-1.pddl"),
        ("planbench", "instance-2.pddl"),
        ("tot24", "4 5 6 10 (rank 901)"),
        ("tot24", "1 2 4 7 (rank 902)"),
    }
    text = " ".join(result.output.split())
    # The published figures, beside the tables, with the setting each was measured in.
    assert "tot24: published figures on its tasks" in text
    assert "GPT-4, Tree of Thoughts" in text and "│ 74.0% │" in text
    assert "planbench: published figures on its tasks" in text and "o1-preview" in text
    assert "checked by VAL" in text and "other setting" in text
    summary = (out / "summary.md").read_text()
    assert "no tools, no replanning; checked by VAL | the 501 Blocksworld instances" in summary
    assert "| GPT-4 | IO prompting | 7.3% |" in summary
    assert "same tasks, other setting" in summary


def _instruction_step_plan(request: ModelRequest) -> ModelResponse:
    """A plan whose one step is not an action: an executor would have to act on its own."""
    if request.phase == "planning":
        step = Step(id="all", title="solve", instruction="Solve the blocks problem.")
        return plan_response(Plan(goal="blocks", steps=[step]))
    return ModelResponse(text="done")


@pytest.mark.anyio
async def test_planbench_s_own_setting_refuses_a_run_where_a_model_acted(tmp_path: Path) -> None:
    config = BenchConfig(suites=("planbench_oneshot",), strategies=("react",), tasks=1,
                         latency_scale=0)  # fmt: skip
    (record,) = await run_bench(config, tmp_path, model=FunctionModel(_instruction_step_plan))
    assert record["strategy"] == "plan-execute"  # the setting's strategy, whatever was asked
    assert record["success"] is False
    assert "out of PlanBench's setting" in record["verification"] or not record["goal_reached"]
    env = get_suite("planbench_oneshot").environment(get_suite("planbench_oneshot").generate(1)[0])
    assert [t.name for t in env.tools] == ["pick_up", "unstack", "put_down", "stack"]
    assert env.check_run is not None


@pytest.mark.anyio
async def test_planbench_s_own_setting_runs_blind_without_replans(tmp_path: Path) -> None:
    """A wrong plan is not repaired: no replan, no retry, and the tools report no state."""
    wrong = Plan(goal="g", steps=[Step(id="s1", title="t", instruction="Pick up b",
                                       tool="pick_up", args={"block": "b"})])  # fmt: skip
    calls: list[str] = []

    def answer(request: ModelRequest) -> ModelResponse:
        calls.append(request.phase)
        return plan_response(wrong)

    config = BenchConfig(suites=("planbench_oneshot",), strategies=("plan-execute",), tasks=1,
                         latency_scale=0, run_settings={"max_replans": 2})  # fmt: skip
    (record,) = await run_bench(config, tmp_path, model=FunctionModel(answer))
    assert calls == ["planning"]  # written once, never replanned
    assert record["outcome"] == "failed" and record["replans"] == 0
    assert "precondition (ontable b) does not hold" in record["verification"] or (
        record["verification"].startswith("goal not reached after 0 actions")
    )


def test_split_and_task_count_errors_are_one_line(tmp_path: Path) -> None:
    for args, message in (
        (["--suite", "game24", "--split", "all"], "--split all: none of the suites run has splits"),
        (["--suite", "tot24", "--split", "train"], "tot24 has no split 'train'"),
        (["--suite", "game24,tot24", "--tasks", "all"], "but game24 generates its tasks"),
        (["--suite", "tot24", "--tasks", "many"], "--tasks must be a number or all"),
    ):
        result = CliRunner().invoke(app, ["bench", *args, "--out", str(tmp_path / "x")])
        assert result.exit_code == 2, (args, result.output)
        assert result.stderr.startswith("error: ") and message in result.stderr
        assert len(result.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "x").exists()


def test_tasks_all_takes_a_whole_split(tmp_path: Path) -> None:
    config = BenchConfig(suites=("tot24",), strategies=("react",), tasks=None, seeds=1)
    assert len(plan_runs(config)) == 100
    sample = random.Random(0).sample(plan_runs(config), 3)
    assert all(901 <= s.task.params["rank"] <= 1000 for s in sample)
    assert json.dumps(sample[0].task.params)  # plain data, as rows hold it
