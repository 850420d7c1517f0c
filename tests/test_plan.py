"""Plans: validation reports every problem, graph helpers, diffs, plan files."""

from __future__ import annotations

import json
from itertools import pairwise
from pathlib import Path
from typing import Any

import networkx as nx
import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from hierplan.errors import UserInputError
from hierplan.files import parse_data_text, parse_yaml_or_json
from hierplan.plans.plan import (
    Plan,
    Step,
    critical_path,
    diff_plans,
    load_plan,
    plan_from_data,
    plan_to_yaml,
    topological_order,
    validate_plan,
)


def step(sid: str, *deps: str, **extra: Any) -> Step:
    return Step(id=sid, title=sid.upper(), instruction=f"do {sid}", depends_on=list(deps), **extra)


def codes(plan: Plan, **kwargs: Any) -> list[str]:
    return sorted(p.code for p in validate_plan(plan, **kwargs))


def test_valid_plan_has_no_problems() -> None:
    plan = Plan(goal="g", steps=[step("a"), step("b", "a"), step("c", "a"), step("d", "b", "c")])
    assert validate_plan(plan, tools=[]) == []


def test_every_problem_is_reported_at_once() -> None:
    plan = Plan(
        goal="g",
        steps=[
            step("a", "b"),
            step("b", "a"),
            step("a"),
            step("c", "missing", "c"),
            step("d", tool="rm_rf"),
            step("e", kind="subgoal"),
            step("f", args={"x": 1}),
        ],
    )
    found = codes(plan, tools=["ls"], max_steps=5, depth=3, max_depth=3)
    assert found == sorted(
        [
            "too_many_steps",
            "duplicate_id",
            "cycle",
            "dangling_dependency",
            "self_dependency",
            "unknown_tool",
            "too_deep",
            "args_without_tool",
        ]
    )


def test_messages_say_what_is_wrong() -> None:
    plan = Plan(goal="g", steps=[step("a", "b"), step("b", "a"), step("c", tool="drop")])
    messages = [str(p) for p in validate_plan(plan, tools=["copy"])]
    assert "dependency cycle among steps: a -> b -> a" in messages
    assert any("'drop'" in m and "allowed: copy" in m for m in messages)


def test_a_reference_to_a_step_it_does_not_depend_on_is_a_problem() -> None:
    # What the run's gate refuses, a plan checked on its own (hierplan validate) refuses too.
    plan = Plan(
        goal="g",
        steps=[
            step("x", tool="add", args={"a": 1, "b": 2}),
            step("t", tool="add", args={"a": "$x", "b": 1}),
            step("u", "x", tool="add", args={"a": ["$x"], "b": {"c": "total $100, $t."}}),
            step("v", tool="add", args={"a": "$v"}),
        ],
    )
    problems = validate_plan(plan, tools=["add"])
    assert [(p.code, p.step, str(p)) for p in problems] == [
        ("bad_reference", "t", "step 't' uses $x but does not depend on 'x'"),
        ("bad_reference", "u", "step 'u' uses $t but does not depend on 't'"),
        (
            "bad_reference",
            "v",
            "step 'v' uses $v, its own result, which does not exist before it runs: refer to "
            "a step it depends on",
        ),
    ]
    fixed = Plan(
        goal="g",
        steps=[
            step("x", tool="add", args={"a": 1, "b": 2}),
            step("t", "x", tool="add", args={"a": "$x", "b": 1}),
        ],
    )
    assert validate_plan(fixed, tools=["add"]) == []


def test_a_cycle_is_named_by_its_real_links() -> None:
    # a needs d, b and c need a, d needs b and c: no link joins b and c. In the message,
    # "x -> y" means y depends on x (the direction of Plan.graph), as for "a -> b -> a".
    plan = Plan(
        goal="g",
        steps=[step("a", "d"), step("b", "a"), step("c", "a"), step("d", "b", "c")],
    )
    problems = validate_plan(plan)
    assert [(p.code, p.step, str(p)) for p in problems] == [
        (
            "cycle",
            "a",
            "dependency cycle among steps: a -> b -> d -> a (c is in a cycle with them too)",
        )
    ]
    names = str(problems[0]).split(": ", 1)[1].split(" (")[0].split(" -> ")
    needs = {s.id: set(s.depends_on) for s in plan.steps}
    assert all(before in needs[after] for before, after in pairwise(names))


@given(
    st.lists(
        st.tuples(st.sampled_from("abcdefg"), st.lists(st.sampled_from("abcdefgz"), max_size=3)),
        min_size=1,
        max_size=9,
    )
)
def test_a_cycle_is_reported_exactly_when_the_dependency_graph_has_one(
    steps: list[tuple[str, list[str]]],
) -> None:
    """Plans of repeated ids, self and dangling dependencies included: the quick check that
    spares valid plans the graph agrees with networkx on the graph itself."""
    plan = Plan(goal="g", steps=[step(i, *deps) for i, deps in steps])
    graph = plan.graph()
    graph.remove_edges_from(list(nx.selfloop_edges(graph)))
    cycles = [p for p in validate_plan(plan) if p.code == "cycle"]
    assert bool(cycles) == (not nx.is_directed_acyclic_graph(graph))


def test_each_cycle_is_a_path_through_real_dependencies() -> None:
    # Two separate cycles; the longer one has a shortcut, so the cycle named is the short one.
    plan = Plan(
        goal="g",
        steps=[
            step("p", "s"),
            step("q", "p"),
            step("r", "q"),
            step("s", "r", "p"),
            step("x", "y"),
            step("y", "x"),
        ],
    )
    assert [str(p) for p in validate_plan(plan)] == [
        "dependency cycle among steps: p -> s -> p (q, r are in a cycle with them too)",
        "dependency cycle among steps: x -> y -> x",
    ]


def test_empty_plan_and_tool_allowlist_on_steps() -> None:
    assert codes(Plan(goal="g", steps=[])) == ["empty"]
    plan = Plan(goal="g", steps=[step("a", kind="subgoal", tools=["ls", "nope"])])
    assert codes(plan, tools=["ls"]) == ["unknown_tool"]
    # the step would be refused its own tool when it runs: the gate says so first
    for tools in ([], ["cat"]):
        plan = Plan(goal="g", steps=[step("a", tool="ls", tools=tools)])
        assert codes(plan, tools=["ls", "cat"]) == ["tool_not_in_tools"]
    assert codes(Plan(goal="g", steps=[step("a", tool="ls", tools=["ls"])]), tools=["ls"]) == []


def test_subgoal_allowed_above_max_depth_only() -> None:
    plan = Plan(goal="g", steps=[step("a", kind="subgoal")])
    assert codes(plan, depth=1, max_depth=2) == []
    assert codes(plan, depth=2, max_depth=2) == ["too_deep"]


def test_a_blank_instruction_is_a_problem_unless_the_tool_is_called_directly() -> None:
    blank = Plan(
        goal="g",
        steps=[
            Step(id="a", title="A", instruction=" \n\t"),
            Step(id="b", title="B", instruction=" ", kind="subgoal"),
            Step(id="c", title="C", instruction=" ", tool="t"),
            Step(id="d", title="D", instruction=" ", tool="t", args={"x": 1}),
        ],
    )
    problems = validate_plan(blank, tools=["t"])
    assert [(p.code, p.step) for p in problems] == [
        ("blank_instruction", "a"),
        ("blank_instruction", "b"),
        ("blank_instruction", "c"),
    ]
    assert str(problems[0]) == "step 'a' has a blank instruction: say what the step does"


def test_an_inf_or_nan_argument_is_a_problem(tmp_path: Path) -> None:
    path = tmp_path / "plan.yaml"
    path.write_text(
        "goal: g\nsteps:\n  - {id: a, title: A, instruction: x, tool: t, args: {n: .inf}}\n"
        "  - {id: b, title: B, instruction: y, tool: t, args: {n: [1, {m: .nan}]}}\n"
        "  - {id: c, title: C, instruction: z, tool: t, args: {n: 1.5}}\n"
    )
    problems = validate_plan(load_plan(path), tools=["t"])
    assert [(p.code, p.step) for p in problems] == [
        ("non_finite_arg", "a"),
        ("non_finite_arg", "b"),
    ]
    assert str(problems[0]) == "step 'a' has an argument that is inf or nan: give a finite number"


def test_topological_order_keeps_plan_order_for_ties() -> None:
    plan = Plan(goal="g", steps=[step("c"), step("a", "c"), step("b"), step("d", "a", "b")])
    assert topological_order(plan) == ["c", "a", "b", "d"]
    with pytest.raises(ValueError, match="cycle"):
        topological_order(Plan(goal="g", steps=[step("a", "b"), step("b", "a")]))


def test_critical_path_uses_durations() -> None:
    plan = Plan(goal="g", steps=[step("a"), step("b", "a"), step("c", "a"), step("d", "b", "c")])
    assert critical_path(plan) == (3.0, ["a", "b", "d"])
    length, chain = critical_path(plan, {"a": 1, "b": 1, "c": 5, "d": 2})
    assert (length, chain) == (8.0, ["a", "c", "d"])
    assert critical_path(Plan(goal="g", steps=[])) == (0.0, [])


def test_diff_plans() -> None:
    old = Plan(goal="g", steps=[step("a"), step("b", "a"), step("c")])
    new = Plan(goal="g", steps=[step("a"), Step(id="b", title="B", instruction="other"), step("d")])
    diff = diff_plans(old, new)
    assert (diff.added, diff.removed, diff.changed) == (("d",), ("c",), ("b",))
    assert diff.summary() == "+1 -1 ~1 (added: d; removed: c; changed: b)"
    assert diff_plans(old, old).empty


def test_plan_files_round_trip(tmp_path: Path) -> None:
    plan = Plan(
        goal="g",
        steps=[step("a", tool="copy", args={"table": "t"}), step("b", "a", kind="subgoal")],
    )
    path = tmp_path / "plan.yaml"
    path.write_text(plan_to_yaml(plan))
    assert load_plan(path) == plan
    json_path = tmp_path / "plan.json"
    json_path.write_text(plan.model_dump_json())
    assert load_plan(json_path) == plan
    # with the byte-order mark some editors write first
    json_path.write_text("\ufeff" + plan.model_dump_json(), encoding="utf-8")
    assert load_plan(json_path) == plan


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("goal: [unclosed", "not valid YAML/JSON"),
        ("- just\n- a list\n", "not a valid plan"),
        ("goal: g\nsteps:\n  - id: 'a b'\n    title: t\n    instruction: i\n", "steps.0.id"),
        ("goal: g\nsteps: []\nsurprise: 1\n", "surprise"),
    ],
)
def test_bad_plan_files_give_clear_errors(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "plan.yaml"
    path.write_text(text)
    with pytest.raises(UserInputError, match=message):
        load_plan(path)


_BOMB = "".join(
    [
        "goal: g\nsteps:\n  - id: a\n    title: A\n    instruction: x\n    tool: t\n    args:\n",
        '      a0: &a0 ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]\n',
        *(f"      a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 9)}]\n" for i in range(1, 9)),
    ]
)


@pytest.mark.parametrize(
    ("name", "text", "message"),
    [
        # PyYAML and json keep the last of two equal keys: the first steps would vanish unseen.
        (
            "plan.yaml",
            "goal: g\nsteps:\n  - {id: a, title: A, instruction: x}\nsteps: []\n",
            r"key 'steps' appears twice in one mapping \(line 4\)",
        ),
        (
            "plan.json",
            '{"goal": "g", "goal": "h", "steps": []}',
            "key 'goal' appears twice in one object",
        ),
        ("plan.yaml", _BOMB, "aliases expand to more than 100,000 values"),
        (
            "plan.yaml",
            "goal: g\nsteps:\n  - {id: a, title: A, instruction: x, tool: t, args: {q: &r [*r]}}\n",
            "an alias refers to a value that contains it",
        ),
        # a value YAML cannot convert is a bad value, not a number with too many digits
        (
            "plan.yaml",
            "goal: g\nsteps: []\nw: !!timestamp 2020-02-30\n",
            r"'2020-02-30' is not a valid ",
        ),
        ("plan.yaml", "goal: g\nsteps: []\nn: !!int abc\n", r"'abc' is not a valid int \(line 3\)"),
        ("plan.yaml", 'goal: g\nsteps: []\nw: !!timestamp "x"\n', "'x' is not a valid timestamp"),
        ("plan.yaml", "goal: g\nsteps: []\nn: !!int ''\n", "'' is not a valid int"),
        ("plan.yaml", "goal: g\nsteps: []\nx: " + "7" * 5000, r"too many digits \(line 3\)"),
        # the problem and its place, not only PyYAML's context line
        ("plan.yaml", "goal: [unclosed", r"expected ',' or '\]'.*\(line 1, column 16\)"),
    ],
)
def test_plan_files_that_would_mislead_or_explode_are_refused(
    tmp_path: Path, name: str, text: str, message: str
) -> None:
    path = tmp_path / name
    path.write_text(text)
    with pytest.raises(UserInputError, match=message):
        load_plan(path)


def test_an_unquoted_date_in_a_plan_file_is_the_text_written(tmp_path: Path) -> None:
    # As in JSON: a tool's string argument gets the string, and the plan saved again is the same.
    path = tmp_path / "plan.yaml"
    path.write_text(
        "goal: g\nsteps:\n  - {id: a, title: A, instruction: x, tool: t, args: {day: 2024-05-01}}\n"
    )
    plan = load_plan(path)
    assert plan.step("a").args == {"day": "2024-05-01"}
    path.write_text(plan_to_yaml(plan))
    assert load_plan(path) == plan


@pytest.mark.parametrize(
    ("text", "value"),
    [("1e3", 1000.0), ("-1E-3", -0.001), ("1.5e3", 1500.0), (".5e3", 500.0), ("2e+2", 200.0)],
)
def test_a_number_with_an_exponent_is_a_number_as_in_json(text: str, value: float) -> None:
    # YAML 1.1 reads "1e3" as text: a setting `step_timeout_s: 1e3` would be no number.
    assert parse_data_text(text) == value
    assert parse_data_text(f"x: {text}") == {"x": value}
    assert parse_data_text("[1e3x, e3, 1e, '1e3']") == ["1e3x", "e3", "1e", "1e3"]


@given(st.integers(-(10**6), 10**6), st.integers(-300, 300), st.booleans())
def test_any_json_number_with_an_exponent_reads_as_json_reads_it(
    mantissa: int, exponent: int, point: bool
) -> None:
    text = f"{mantissa}{'.5' if point else ''}e{exponent}"
    assert parse_data_text(text) == json.loads(text)


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("010", 10),  # YAML 1.1: octal 8
        ("-007", -7),
        ("0x1F", 31),
        ("0o17", 15),
        ("1_000", "1_000"),  # YAML 1.1: 1000
        ("1:30", "1:30"),  # YAML 1.1: 90 (base 60)
        ("1:30.5", "1:30.5"),
        ("1_0.5", "1_0.5"),
        ("no", "no"),  # YAML 1.1: false
        ("Off", "Off"),
        ("y", "y"),
        ("true", True),
        ("FALSE", False),
        ("null", None),
        (".inf", float("inf")),
        ("!!bool yes", True),  # an explicit tag still converts as it says
        ("!!int 0x10", 16),
    ],
)
def test_plain_scalars_read_as_yaml_1_2_and_json_read_them(text: str, value: object) -> None:
    assert parse_data_text(f"x: {text}") == {"x": value}


@given(st.integers())
def test_any_json_integer_reads_as_json_reads_it(number: int) -> None:
    assert parse_data_text(str(number)) == json.loads(str(number))


def test_yaml_anchors_and_merge_keys_still_work(tmp_path: Path) -> None:
    path = tmp_path / "plan.yaml"
    path.write_text(
        "goal: g\nsteps:\n  - &a {id: a, title: A, instruction: x, tool: t, args: {q: 1}}\n"
        "  - <<: *a\n    id: b\n    depends_on: [a]\n"
    )
    plan = load_plan(path)
    assert [s.id for s in plan.steps] == ["a", "b"]
    assert plan.step("b").args == {"q": 1}


def test_a_plan_with_many_bad_fields_gets_a_short_error(tmp_path: Path) -> None:
    path = tmp_path / "plan.json"
    path.write_text(json.dumps({"goal": "g", "steps": [{"id": f"s{i}"} for i in range(3000)]}))
    with pytest.raises(UserInputError) as caught:
        load_plan(path)
    message = str(caught.value)
    assert message.count("Field required") == 10  # the first ten, then how many more
    assert message.startswith(f"plan file {path} is not a valid plan: steps.0.title: Field")
    assert message.endswith("; and 5990 more")


def test_missing_plan_file(tmp_path: Path) -> None:
    with pytest.raises(UserInputError, match="cannot read plan file"):
        load_plan(tmp_path / "nope.yaml")


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=8),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=20,
)
step_like = st.fixed_dictionaries(
    {"id": st.text(max_size=6), "title": st.text(max_size=6), "instruction": st.text(max_size=6)},
    optional={
        "depends_on": st.lists(st.text(max_size=3), max_size=3),
        "kind": st.sampled_from(["task", "subgoal", "other"]),
        "tool": st.none() | st.text(max_size=4),
        "args": json_values,
    },
)


@settings(max_examples=300)
@given(
    st.one_of(
        json_values,
        st.fixed_dictionaries(
            {"goal": st.text(max_size=5), "steps": st.lists(step_like, max_size=6)}
        ),
    )
)
def test_untrusted_plan_data_is_accepted_or_rejected_cleanly(data: Any) -> None:
    """Whatever a model or a file holds, parsing gives a Plan or a UserInputError."""
    try:
        plan = plan_from_data(data)
    except UserInputError as exc:
        assert "not a valid plan" in str(exc)
        return
    problems = validate_plan(plan, tools=["t"])
    assert all(p.message for p in problems)
    if not problems:
        assert sorted(topological_order(plan)) == sorted(s.id for s in plan.steps)
        json.dumps(plan.model_dump(mode="json"))


def test_a_step_does_the_same_work_whatever_its_title_or_estimate() -> None:
    base = Step(id="a", title="A", instruction="sum them", depends_on=["x", "y"], tools=["t", "u"])
    same = base.model_copy(
        update={"title": "B", "estimate_usd": 1.0, "depends_on": ["y", "x"], "tools": ["u", "t"]}
    )
    assert base.same_work(same)
    for change in (
        {"instruction": "sum them twice"},  # the executor model reads it
        {"depends_on": ["x"]},
        {"tools": None},
        {"tool": "t"},
        {"kind": "subgoal"},
    ):
        assert not base.same_work(base.model_copy(update=change)), change
    direct = Step(id="d", title="D", instruction="copy", tool="t", args={"n": 1})
    assert direct.same_work(direct.model_copy(update={"instruction": "copy it"}))
    assert not direct.same_work(direct.model_copy(update={"args": {"n": 2}}))


# Pieces of YAML and JSON syntax, tags and scalars, joined at random: most texts are broken.
yaml_text = st.lists(
    st.sampled_from(
        [*"ab1-:[]{}&*!<>?|%@'\"\\,.#\n ", "!!int ", "!!timestamp ", "2020-02-30", "&x ", "*x"]
    ),
    max_size=40,
).map("".join)


@settings(max_examples=500, deadline=None)
@given(yaml_text, st.sampled_from(["plan.yaml", "plan.json"]))
def test_untrusted_plan_text_gives_a_plan_or_one_line_error(text: str, name: str) -> None:
    """Whatever a plan file holds, reading it gives a Plan or a one-line UserInputError."""
    path = Path("/nonexistent") / name
    try:
        data = parse_yaml_or_json(text, path, "plan file")
        plan_from_data(data, source=f"plan file {path}")
    except UserInputError as exc:
        assert "\n" not in str(exc)
        assert str(exc).startswith(f"plan file {path} ")


def test_yaml_line_breaks_in_text_survive_a_plan_file() -> None:
    # YAML reads \x85, \u2028 and \u2029 as line breaks: written bare, they came back a space.
    plan = Plan(goal="g\u2028h", steps=[step("a", tool="t", args={"text": "a\x85b\u2029c"})])
    assert plan_from_data(yaml.safe_load(plan_to_yaml(plan))) == plan


plain_values = (
    st.text(max_size=10) | st.integers() | st.floats(allow_nan=False, allow_infinity=False)
)


@settings(max_examples=300, deadline=None)
@given(
    st.text(min_size=1, max_size=20),
    st.text(min_size=1, max_size=20),
    st.dictionaries(st.text(max_size=5), plain_values, max_size=3),
)
def test_a_plan_written_as_yaml_reads_back_the_same(
    text: str, title: str, args: dict[str, Any]
) -> None:
    """What a reviewer is given to edit (and a paused run saves) is the plan itself."""
    try:
        plan = Plan(
            goal=text, steps=[Step(id="a", title=title, instruction=text, tool="t", args=args)]
        )
    except ValidationError:
        return  # a title too long, for instance: not a plan
    assert plan_from_data(yaml.safe_load(plan_to_yaml(plan))) == plan
