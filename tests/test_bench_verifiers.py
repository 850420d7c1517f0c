"""Each suite's verifier against known good and bad plans, and the suites' untrusted inputs."""

from __future__ import annotations

from fractions import Fraction

import anyio
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hierplan.agents.prompts import PlanPrompt
from hierplan.bench.base import ActionFailed
from hierplan.bench.suites import blocksworld as bw
from hierplan.bench.suites import crafting as cr
from hierplan.bench.suites import game24 as g24
from hierplan.bench.suites import get_suite
from hierplan.bench.suites import parallel_qa as pqa
from hierplan.errors import ToolError

# -- blocksworld ----------------------------------------------------------------------------

# red on table with blue on it; yellow on table. Goal: red on yellow.
START = bw.World.from_towers([["red", "blue"], ["yellow"]])
GOAL = {"red": "yellow"}


def test_blocksworld_accepts_a_valid_plan() -> None:
    plan = [("unstack", "blue", "red"), ("put_down", "blue"), ("pick_up", "red"),
            ("stack", "red", "yellow")]  # fmt: skip
    verdict = bw.validate_actions(START, GOAL, plan)
    assert verdict.ok, verdict.summary


@pytest.mark.parametrize(
    ("plan", "reason"),
    [
        (
            [("pick_up", "red")],
            "action 1 pick_up red is invalid: cannot pick_up red: it is not clear",
        ),
        ([("unstack", "blue", "yellow")], "it is on red"),
        ([("unstack", "blue", "red"), ("pick_up", "red")], "the hand already holds blue"),
        ([("stack", "red", "yellow")], "the hand holds nothing"),
        ([("unstack", "blue", "red"), ("stack", "blue", "blue")], "blue is not clear"),
        ([("pick_up", "green")], "there is no 'green' block"),
        ([("unstack", "blue", "red"), ("put_down", "blue")], "goal not reached after 2 actions"),
    ],
)
def test_blocksworld_rejects_bad_plans(plan: list[tuple[str, ...]], reason: str) -> None:
    verdict = bw.validate_actions(START, GOAL, plan)
    assert not verdict.ok
    assert reason in verdict.summary


def test_blocksworld_oracle_plans_validate_on_generated_tasks() -> None:
    oracle = get_suite("blocksworld").oracle()
    for task in get_suite("blocksworld").generate(60, seed=3):
        instance = task.data
        plan = oracle.plan(PlanPrompt(goal=task.goal, depth=1, max_depth=1, max_steps=50))
        assert plan is not None
        actions = [(s.tool, *s.args.values()) for s in plan.steps if s.tool and s.args]
        assert bw.validate_actions(instance.start, instance.goal, actions).ok
        assert all(2 <= len(a) <= 3 for a in actions)


@pytest.mark.parametrize("seed", [0, 5, 9])
def test_blocksworld_tasks_are_all_different(seed: int) -> None:
    """A repeated problem would count as a second independent task; the first ones stay
    what they were when more are asked for."""
    tasks = get_suite("blocksworld").generate(120, seed=seed)
    assert len({t.goal for t in tasks}) == len(tasks) == 120
    assert [t.goal for t in get_suite("blocksworld").generate(10, seed=seed)] == [
        t.goal for t in tasks[:10]
    ]


def test_blocksworld_state_text_round_trips() -> None:
    world = bw.World.from_towers([["a", "b", "c"], ["d"]], hand=None)
    text = world.describe("state 4")
    assert text == "<state 4: towers a,b,c | d; hand empty>"
    assert bw.parse_world(text) == world


def test_blocksworld_tools_refuse_bad_actions_and_report_state() -> None:
    env = bw.BlocksEnv(START)
    pick_up, unstack, *_ = env.tools()

    async def go() -> None:
        with pytest.raises(ActionFailed, match=r"not clear\. Now: <state 0: towers"):
            await pick_up.call({"block": "red"})
        out = await unstack.call({"block": "blue", "from_block": "red"})
        assert out.endswith("<state 1: towers red | yellow; hand blue>")

    anyio.run(go)
    assert env.log == [("unstack", "blue", "red")]


# -- crafting -------------------------------------------------------------------------------

PLANK = cr.Recipe("oak plank", 4, (("oak log", 1),))
STICK = cr.Recipe("stick", 2, (("oak plank", 2),))
TORCH = cr.Recipe("torch", 1, (("stick", 1), ("coal", 1)))
INSTANCE = cr.CraftInstance("torch", 1, (PLANK, STICK, TORCH), ("coal", "oak log"), 3)


def test_crafting_accepts_a_valid_sequence() -> None:
    actions = [("get", "oak log", 1), ("get", "coal", 1), ("craft", "oak plank", 1),
               ("craft", "stick", 1), ("craft", "torch", 1)]  # fmt: skip
    verdict = cr.validate_actions(INSTANCE, actions)
    assert verdict.ok, verdict.summary


@pytest.mark.parametrize(
    ("actions", "reason"),
    [
        ([("craft", "stick", 1)], "need 2 oak plank (have 0)"),
        ([("get", "stick", 1)], "only base items can be fetched"),
        ([("get", "coal", 0)], "the number must be at least 1"),
        ([("get", "coal", 65)], "at most 64"),
        ([("craft", "sword", 1)], "no crafting command for 'sword'"),
        ([("get", "oak log", 1), ("craft", "oak plank", 1)], "torch is not in the final inventory"),
    ],
)
def test_crafting_rejects_bad_sequences(actions: list[tuple[str, str, int]], reason: str) -> None:
    verdict = cr.validate_actions(INSTANCE, actions)
    assert not verdict.ok
    assert reason in verdict.summary


def test_crafting_solver_counts_shared_ingredients_once() -> None:
    problem = cr.Problem("torch", 3, {r.item: r for r in INSTANCE.recipes}, INSTANCE.base, True)
    gets, crafts = cr.solve(problem, {})
    # 3 torches: 3 sticks (2 crafts), 4 planks (1 craft), 1 log, 3 coal
    assert gets == {"coal": 3, "oak log": 1}
    assert [(i, t) for i, t, _ in crafts] == [("oak plank", 1), ("stick", 2), ("torch", 3)]


def test_crafting_oracle_plans_validate_on_generated_tasks() -> None:
    suite = get_suite("crafting")
    for task in suite.generate(40, seed=5):
        plan = suite.oracle().plan(PlanPrompt(goal=task.goal, depth=1, max_depth=1, max_steps=50))
        assert plan is not None
        actions = [
            (s.tool, s.args["item"], s.args.get("count", s.args.get("times")))
            for s in plan.steps
            if s.tool and s.args
        ]
        assert cr.validate_actions(task.data, actions).ok  # type: ignore[arg-type]


def test_crafting_text_parses_back() -> None:
    task = get_suite("crafting").generate(1, seed=1)[0]
    problem = cr.parse_problem(task.goal)
    assert problem is not None
    assert problem.target == task.data.target
    assert problem.book == {r.item: r for r in task.data.recipes}
    assert problem.base == task.data.base


# -- parallel_qa ----------------------------------------------------------------------------


def test_parallel_qa_answer_checker() -> None:
    assert pqa.check_answer("The answer is 1,234.", 1234).ok
    assert pqa.check_answer("-17.0", -17).ok
    assert pqa.check_answer("829", 829).ok
    assert not pqa.check_answer("1235", 1234).ok
    assert "no number" in pqa.check_answer("I could not find it", 3).summary
    assert pqa.check_answer("\u221245", -45).ok  # a typographic minus is a minus
    assert not pqa.check_answer("\u221245", 45).ok
    assert pqa.check_answer("about .5", 0.5).ok and pqa.check_answer("-.5", -0.5).ok


@pytest.mark.parametrize(
    ("answer", "gold", "reason"),
    [
        # Several numbers are not one final answer, even when the last (or any) is right.
        ("the answer is 7 (not 829)", 829, "not one final answer: 2 numbers (7, 829)"),
        ("f1: 12\nc1: 40", 40, "not one final answer"),
        ("3, 4", 34, "not one final answer"),  # not a thousands separator
        # Gold answers are integers, compared exactly: no relative tolerance.
        ("1026402", 1026401, "answer 1026402 is wrong"),
        ("1,026,400", 1026401, "answer 1026400 is wrong"),
        ("829.5", 829, "answer 829.5 is wrong"),
        ("829.000001", 829, "is wrong"),
    ],
)
def test_parallel_qa_refuses_each_kind_of_wrong_answer(answer: str, gold: int, reason: str) -> None:
    verdict = pqa.check_answer(answer, gold)
    assert not verdict.ok
    assert reason in verdict.summary


def test_parallel_qa_gold_answer_and_critical_path_by_hand() -> None:
    a, b, c = ("Varn", "area"), ("Quil", "rainfall"), ("Tor", "elevation")
    expr = pqa.Expr(
        "sum",
        (pqa.Expr("lookup", fact=a),
         pqa.Expr("difference", (pqa.Expr("lookup", fact=b), pqa.Expr("lookup", fact=c)))),
    )  # fmt: skip
    assert pqa.evaluate(expr, {a: 10.0, b: 50.0, c: 8.0}) == 52.0
    deepest = max(pqa.lookup_seconds(b), pqa.lookup_seconds(c)) + pqa.ARITHMETIC_S
    expected = max(pqa.lookup_seconds(a), deepest) + pqa.ARITHMETIC_S
    assert pqa.critical_path_s(expr) == pytest.approx(expected)
    assert pqa.parse_expr(expr.phrase()) == expr


def test_parallel_qa_questions_parse_back_and_fit_the_spec() -> None:
    for task in get_suite("parallel_qa").generate(80, seed=2):
        instance = task.data
        assert pqa.parse_problem(task.goal) == instance.expr
        assert 1 <= task.params["depth"] <= 3 and 2 <= task.params["fan_out"] <= 5
        assert len(instance.expr.children) == task.params["fan_out"]
        values = {f: float(v) for f, v in instance.kb.items()}
        assert pqa.evaluate(instance.expr, values) == instance.answer
        assert task.critical_path_s is not None and task.critical_path_s > 0


# -- game24 ---------------------------------------------------------------------------------


def test_game24_has_1362_solvable_puzzles() -> None:
    assert len(g24.solvable_puzzles()) == 1362


@pytest.mark.parametrize(
    ("expression", "numbers", "ok", "reason"),
    [
        ("(8 - 4) * (7 - 1)", [8, 4, 7, 1], True, "= 24"),
        ("8 / (3 - 8 / 3)", [8, 3, 8, 3], True, "= 24"),  # needs exact fractions
        ("(8 - 4) * (7 - 1)", [8, 4, 7, 2], False, "not each of"),
        ("6 * 4", [6, 4, 1, 1], False, "not each of"),
        ("(1 + 2) * (3 + 4)", [1, 2, 3, 4], False, "= 21, not 24"),
        ("2 ** 4 + 8 * 1", [2, 4, 8, 1], False, "not allowed"),
        ("24.0 * 1 * 1 * 1", [24, 1, 1, 1], False, "not allowed"),
        ("x * 24", [24], False, "not allowed"),
        ("(8 - 4) * (7 - 1", [8, 4, 7, 1], False, "not an arithmetic expression"),
        ("4 / (1 - 1) + 24", [4, 1, 1, 24], False, "division by zero"),
    ],
)
def test_game24_exact_checker(expression: str, numbers: list[int], ok: bool, reason: str) -> None:
    verdict = g24.check_expression(expression, numbers)
    assert verdict.ok is ok
    assert reason in verdict.summary


def test_game24_environment_verifies_the_pool() -> None:
    env = g24.PoolEnv([8, 4, 7, 1])
    assert "still holds 4 numbers" in env.verify().summary
    env.combine(8, "-", 4)
    env.combine(7, "-", 1)
    assert not env.verify().ok
    env.combine(4, "*", 6)
    assert env.verify().ok
    assert env.pool == [(Fraction(24), "((8 - 4) * (7 - 1))")]
    with pytest.raises(ActionFailed, match="not in the pool"):
        env.combine(5, "+", 1)


def test_game24_takes_decimals_and_typographic_signs_as_a_model_writes_them() -> None:
    env = g24.PoolEnv([3, 3, 8, 8])
    env.combine(8, "\u00f7", 3)  # the division sign
    env.combine(3, "\u2212", 8 / 3)  # a minus sign, and 8/3 as a JSON number would carry it
    assert env.combine(8, "/", 1 / 3).endswith("= 24. Now: <pool 3: 24 = (8 / (3 - (8 / 3)))>")
    assert env.verify().ok
    env = g24.PoolEnv([1, 2, 3, 4])
    assert "1 * 2 = 2" in env.combine(1, "\u00d7", 2.0)
    with pytest.raises(ActionFailed, match="must be numbers"):
        env.combine(float("nan"), "+", 3)


def test_game24_solver_finds_fraction_solutions() -> None:
    moves = g24.solve([Fraction(n) for n in (3, 3, 8, 8)])
    assert moves is not None
    pool = [Fraction(n) for n in (3, 3, 8, 8)]
    for a, op, b in moves:
        pool.remove(a)
        pool.remove(b)
        pool.append(g24.apply_op(a, op, b))
    assert pool == [24]
    assert g24.solve([Fraction(1)] * 4) is None


# -- untrusted input: model-chosen arguments and free text never crash the suites ----------

_text = st.text(max_size=60)


@settings(max_examples=150, deadline=None)
@given(expression=_text)
def test_game24_checker_never_raises(expression: str) -> None:
    verdict = g24.check_expression(expression, [1, 2, 3, 4])
    assert verdict.ok in (True, False)


@settings(max_examples=100, deadline=None)
@given(a=st.one_of(st.integers(), _text), op=_text, b=st.one_of(st.integers(), _text))
def test_game24_combine_fails_only_with_action_failed(a: int | str, op: str, b: int | str) -> None:
    env = g24.PoolEnv([2, 3, 4, 6])
    try:
        env.combine(a, op, b)
    except ActionFailed:
        assert len(env.pool) == 4


@settings(max_examples=100, deadline=None)
@given(name=st.sampled_from(["pick_up", "put_down", "stack", "unstack"]), x=_text, y=_text)
def test_blocksworld_actions_fail_only_with_action_failed(name: str, x: str, y: str) -> None:
    action = (name, x) if name in ("pick_up", "put_down") else (name, x, y)
    try:
        after = bw.apply(START, action)
    except ActionFailed as exc:
        assert str(exc)
    else:  # only a real block in a legal move gets here
        assert {b for b, _ in after.below} | {after.hand} >= {x}


@settings(max_examples=100, deadline=None)
@given(kind=st.sampled_from(["get", "craft"]), item=_text, n=st.integers(-5, 200))
def test_crafting_actions_fail_only_with_action_failed(kind: str, item: str, n: int) -> None:
    book = {r.item: r for r in INSTANCE.recipes}
    try:
        after = cr.apply({}, (kind, item, n), book, INSTANCE.base)
    except ActionFailed as exc:
        assert str(exc)
    else:  # from an empty inventory only fetching a base item can work
        assert kind == "get" and item in INSTANCE.base and after == {item: n}


@settings(max_examples=100, deadline=None)
@given(text=_text)
def test_oracles_ignore_text_they_do_not_know(text: str) -> None:
    prompt = PlanPrompt(goal=text, depth=1, max_depth=2, max_steps=50)
    for name in ("blocksworld", "parallel_qa", "crafting", "game24"):
        assert get_suite(name).oracle().plan(prompt) is None


def test_action_failed_is_a_tool_error_that_is_not_retried() -> None:
    assert issubclass(ActionFailed, ToolError)
    assert ActionFailed.retryable is False
