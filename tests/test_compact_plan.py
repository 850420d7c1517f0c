"""The compact plan format: what a planner model writes, read into the typed plan.

A plan's text comes from a model, so the reader is fuzzed: whatever the text, it returns a plan
or raises :class:`PlanParseError`, never another exception.
"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hierplan.errors import PlanParseError
from hierplan.plans.compact import (
    CompactStream,
    parse_compact,
    render_compact,
)
from hierplan.plans.plan import Plan, Step, validate_plan

PARAMS = {"lookup": ("entity", "attribute"), "add": ("a", "b", "c"), "search": ("query",)}

FUZZ = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def test_a_plan_of_lookups_and_a_sum() -> None:
    text = '1. lookup("Wenves", "rainfall")\n2. lookup("Oslo", "area")\n3. add($1, $2)\n'
    plan = parse_compact(text, goal="the sum", params=PARAMS)
    assert plan.goal == "the sum"
    assert [s.args for s in plan.steps] == [
        {"entity": "Wenves", "attribute": "rainfall"},
        {"entity": "Oslo", "attribute": "area"},
        {"a": "$1", "b": "$2"},
    ]
    assert plan.steps[2].depends_on == ["1", "2"]
    assert plan.steps[0].title == 'lookup("Wenves", "rainfall")'
    assert validate_plan(plan, tools=PARAMS) == []


def test_tasks_goals_dependencies_and_plan_fields() -> None:
    text = "\n".join(
        [
            "```",
            "a. search(?) after b0: find the newest report",
            'b. task(tools=["search"]): summarise $a',
            "c. goal(usd=0.01, tokens=900): migrate the orders table",
            'd. lookup(entity="x", attribute="y") after c',
            "left_out: the audit tables; no budget for them",
            "rationale: lookups first",
            "```",
        ]
    )
    plan = parse_compact(text, goal="g", params=PARAMS)
    a, b, c, d = plan.steps
    assert (a.tool, a.args, a.depends_on, a.instruction) == (
        "search",
        None,
        ["b0"],
        "find the newest report",
    )
    assert (b.kind, b.tools, b.depends_on) == ("task", ["search"], ["a"])
    assert (c.kind, c.estimate_usd, c.estimate_tokens) == ("subgoal", 0.01, 900)
    assert d.depends_on == ["c"]
    assert plan.left_out == "the audit tables; no budget for them"
    assert plan.rationale == "lookups first"
    # The dangling "b0" is the gate's to report, as for a plan written as JSON.
    assert [p.code for p in validate_plan(plan)] == ["dangling_dependency"]


@pytest.mark.parametrize(
    "text",
    [
        "1. add($2, 1)\n2. add(1, 1)",  # a later step: it has no result yet
        "1. add(1, 1)\n2. add($7, 1)",  # no step at all
        "1. add(1, 1)\n2. add(a=1, b=$1x)",
    ],
)
def test_a_bare_reference_to_no_step_above_is_refused_naming_its_line(text: str) -> None:
    # Read as text, it would reach the tool as the string "$7" (a streamed step runs at once).
    with pytest.raises(PlanParseError, match=r"plan line \d .*is no step above this line"):
        parse_compact(text, goal="g", params=PARAMS)


def test_text_that_looks_like_a_reference_is_quoted_and_reads_back_as_text() -> None:
    step = Step(id="1", title="t", instruction="t", tool="add", args={"a": "$USD", "b": 1})
    plan = Plan(goal="g", steps=[step])
    text = render_compact(plan, PARAMS)
    assert text == '1. add("$USD", 1)'
    back = parse_compact(text, goal="g", params=PARAMS)
    assert back.steps[0].args == {"a": "$USD", "b": 1} and back.steps[0].depends_on == []
    # A step the plan lost is still referred to as one, as a planner that forgot it writes.
    assert render_compact(plan, PARAMS, lost={"USD"}) == "1. add($USD, 1)"


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("Here is the plan:", "line 1"),
        ("1. lookup", "expected '('"),
        ("1. lookup(", "not a JSON value"),
        ('1. lookup("a" "b")', "separated by ','"),
        ("1. lookup(1, 2, 3)", "at most 2"),
        ("1. fetch(1)", "name=value"),
        ("1. add(a=1, a=2)", "given twice"),
        ("1. task", "needs ': text'"),
        ("1. search(?)", "needs ': text'"),
        ("1. add(a=NaN)", "NaN"),
        ("1. add($)", "step id"),
        ("1. task(usd=1): x", "only a goal"),
        ("1. goal(depth=2): x", "not depth"),
        ("1. add(1) trailing", "unexpected"),
        ("", "no step lines"),
        ("1. add(a=" + "[" * 100_000 + ")", "too deeply"),
    ],
)
def test_bad_lines_say_what_is_wrong(text: str, says: str) -> None:
    with pytest.raises(PlanParseError, match=None) as caught:
        parse_compact(text, goal="g", params=PARAMS)
    assert says in str(caught.value)
    assert "\n" not in str(caught.value)


_ids = st.from_regex(r"[a-z0-9_]{1,6}", fullmatch=True)
_text = st.text(
    st.characters(codec="utf-8", exclude_categories=("Cs", "Cc", "Zl", "Zp")), min_size=1
).filter(lambda t: t.strip() != "")
_json = st.recursive(
    st.none() | st.booleans() | st.integers(-(10**12), 10**12) | st.text(max_size=10),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3)
    ),
    max_leaves=8,
)


@st.composite
def plans(draw: st.DrawFn) -> Plan:
    """Plans of every kind of step, with references to and dependencies on earlier steps."""
    ids = draw(st.lists(_ids, min_size=1, max_size=8, unique=True))
    steps: list[Step] = []
    for index, step_id in enumerate(ids):
        earlier = ids[:index]
        deps = draw(st.lists(st.sampled_from(earlier), unique=True)) if earlier else []
        kind = draw(st.sampled_from(["call", "chosen", "task", "goal"]))
        text = " ".join(draw(_text).split())
        if kind == "call":
            tool = draw(st.sampled_from(sorted(PARAMS)))
            names = draw(st.lists(st.sampled_from(PARAMS[tool]), unique=True))
            refs: list[object] = [f"${d}" for d in deps] or [1]
            args = {n: draw(_json | st.sampled_from(refs)) for n in names}
            step = Step(id=step_id, title="t", instruction="t", tool=tool, args=args)
        elif kind == "chosen":
            step = Step(id=step_id, title="t", instruction=text, tool="search")
        else:
            step = Step(
                id=step_id,
                title="t",
                instruction=text,
                kind="subgoal" if kind == "goal" else "task",
                tools=draw(st.none() | st.lists(st.sampled_from(sorted(PARAMS)), max_size=2)),
                estimate_tokens=draw(st.none() | st.integers(0, 10**6)) if kind == "goal" else None,
            )
        steps.append(step.model_copy(update={"depends_on": deps}))
    left_out = " ".join(draw(st.text(max_size=30)).split())
    return Plan(goal="g", steps=steps, left_out=left_out)


@FUZZ
@given(plans())
def test_a_rendered_plan_reads_back_as_the_same_work(plan: Plan) -> None:
    text = render_compact(plan, PARAMS)
    back = parse_compact(text, goal=plan.goal, params=PARAMS)
    assert len(back.steps) == len(plan.steps)
    for old, new in zip(plan.steps, back.steps, strict=True):
        assert old.same_work(new), (old, new, text)
    assert back.left_out == plan.left_out


@FUZZ
@given(st.text(max_size=300))
def test_any_text_is_a_plan_or_a_plan_parse_error(text: str) -> None:
    try:
        plan = parse_compact(text, goal="g", params=PARAMS)
    except PlanParseError as exc:
        assert str(exc)
    else:
        assert plan.steps


_lines = st.sampled_from(
    [
        '1. lookup("a", "b")',
        "2. add($1, 3)",
        "3. task: sum $2",
        "4. goal(tokens=5): part",
        "5. search(?) after 4: look",
        "left_out: x",
        "1. add(",
        "garbage ()",
        "",
        "```",
    ]
)


@FUZZ
@given(st.lists(_lines | st.text(max_size=40), max_size=8), st.data())
def test_streamed_chunks_read_as_the_whole_text(lines: list[str], data: st.DataObject) -> None:
    text = "\n".join(lines)
    cuts = sorted(data.draw(st.lists(st.integers(0, len(text)), max_size=6)))
    chunks = [text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)], strict=True)]
    try:
        whole: Plan | PlanParseError = parse_compact(text, goal="g", params=PARAMS)
    except PlanParseError as exc:
        whole = exc
    stream = CompactStream("g", PARAMS)
    seen: list[Step] = []
    try:
        for chunk in chunks:
            seen += stream.feed(chunk)
        last, plan = stream.close()
    except PlanParseError as exc:
        assert isinstance(whole, PlanParseError)
        assert str(exc) == str(whole)
        return
    assert isinstance(whole, Plan)
    assert [*seen, *last] == whole.steps == plan.steps


@FUZZ
@given(plans(), st.data())
def test_a_plan_cut_anywhere_streams_a_prefix_of_its_steps(plan: Plan, data: st.DataObject) -> None:
    text = render_compact(plan, PARAMS)
    cut = data.draw(st.integers(0, len(text)))
    stream = CompactStream("g", PARAMS)
    steps = stream.feed(text[:cut])
    assert [s.id for s in steps] == [s.id for s in plan.steps[: len(steps)]]
    # The line that was cut is never read as a step until the stream ends.
    assert len(steps) == text[:cut].count("\n")
