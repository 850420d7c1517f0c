"""Revisions: a replan writes only what is left, and the done steps it builds on stay."""

from __future__ import annotations

import networkx as nx
import pytest
from hypothesis import given
from hypothesis import strategies as st

from hierplan.agents.planner import parse_plan_output
from hierplan.errors import PlanParseError
from hierplan.models.base import ModelResponse
from hierplan.plans.compact import parse_compact, render_compact
from hierplan.plans.plan import Plan, Step, validate_plan
from hierplan.plans.revision import DoneSteps, carried_over

PARAMS = {"lookup": ("key",), "add": ("a", "b")}


def call(step_id: str, tool: str, *deps: str, **args: object) -> Step:
    return Step(
        id=step_id, title=step_id, instruction=step_id, tool=tool, args=args, depends_on=list(deps)
    )


OLD = Plan(
    goal="g",
    steps=[
        call("1", "lookup", key="a"),
        call("2", "lookup", key="b"),
        call("3", "add", "1", "2", a="$1", b="$2"),
        call("4", "lookup", key="c"),
    ],
)


def test_lines_refer_to_done_steps_which_the_plan_keeps() -> None:
    done = DoneSteps.of(OLD, {"1", "4"})
    plan = parse_compact('5. lookup("B")\n6. add($1, $5)', goal="g", params=PARAMS, done=done)
    # 1 is built on; 4 was an answer of the old plan (nothing used it): both stay, first
    assert [s.id for s in plan.steps] == ["1", "4", "5", "6"]
    assert plan.step("6").depends_on == ["1", "5"]
    assert validate_plan(plan) == []
    assert carried_over(OLD, plan, {"1", "4"}) == ["1", "4"]


def test_a_done_step_nothing_builds_on_any_more_is_left_out() -> None:
    done = DoneSteps.of(OLD, {"1", "2"})  # both fed step 3, which the revision replaces
    plan = parse_compact("5. add($2, 1)", goal="g", params=PARAMS, done=done)
    assert [s.id for s in plan.steps] == ["2", "5"]


def test_a_done_line_written_again_is_one_step_and_a_changed_one_is_redone() -> None:
    done = DoneSteps.of(OLD, {"1", "2"})
    text = '1. lookup("a")\n2. lookup("B")\n3. add($1, $2)'
    plan = parse_compact(text, goal="g", params=PARAMS, done=done)
    assert [s.id for s in plan.steps] == ["1", "2", "3"]
    # the copy of 1 stands; 2 was redone, so 3 (built on it) runs again
    assert carried_over(OLD, plan, {"1", "2"}) == ["1"]


def test_a_done_step_built_on_a_redone_one_does_not_stand() -> None:
    old = Plan(
        goal="g",
        steps=[call("1", "lookup", key="a"), call("2", "add", "1", a="$1", b=1)],
    )
    done = DoneSteps.of(old, {"1", "2"})
    plan = parse_compact('1. lookup("A")\n3. add($2, 1)', goal="g", params=PARAMS, done=done)
    # 2's result came from the old 1: it is not kept, and 3's dependency on it dangles,
    # which the gate reports for the planner to repair
    assert [s.id for s in plan.steps] == ["1", "3"]
    assert [p.code for p in validate_plan(plan)] == ["dangling_dependency"]


def test_a_revision_written_as_json_is_merged_the_same_way() -> None:
    done = DoneSteps.of(OLD, {"1", "4"})
    written = Plan(goal="g", steps=[call("6", "add", "1", a="$1", b=2)])
    response = ModelResponse(text="", output=written.model_dump(mode="json"))
    plan = parse_plan_output(response, goal="g", params=PARAMS, done=done)
    assert [s.id for s in plan.steps] == ["1", "4", "6"]


@st.composite
def revisions(draw: st.DrawFn) -> tuple[Plan, set[str], list[Step]]:
    """A plan, a set of its steps that are done (closed under dependencies, as done steps
    are), and the steps a revision writes: new ids and some done ids again, each depending
    on steps before it."""
    n = draw(st.integers(1, 8))
    steps: list[Step] = []
    for i in range(n):
        deps = draw(st.lists(st.sampled_from([s.id for s in steps]), unique=True)) if steps else []
        steps.append(call(f"s{i}", "lookup", *deps, key=i))
    plan = Plan(goal="g", steps=steps)
    done: set[str] = set()
    for s in steps:
        if all(d in done for d in s.depends_on) and draw(st.booleans()):
            done.add(s.id)
    earlier = [s.id for s in steps if s.id in done]
    written: list[Step] = []
    for j in range(draw(st.integers(1, 5))):
        again = [i for i in earlier if i not in {w.id for w in written}]
        reuse: bool = draw(st.booleans())
        step_id: str = draw(st.sampled_from(again)) if again and reuse else f"n{j}"
        deps = []
        if earlier:
            deps = draw(st.lists(st.sampled_from(earlier), unique=True))
        written.append(call(step_id, "lookup", *[d for d in deps if d != step_id], key=-j))
        if step_id not in earlier:
            earlier.append(step_id)
    return plan, done, written


@given(revisions())
def test_a_merged_revision_is_ordered_and_keeps_what_it_must(
    case: tuple[Plan, set[str], list[Step]],
) -> None:
    plan, done, written = case
    kept = DoneSteps.of(plan, done)
    merged = kept.merged(written)
    ids = [s.id for s in merged]
    assert len(ids) == len(set(ids))
    copies = kept.copies(written)
    rest = [w for w in written if w.id not in copies]
    assert merged[len(merged) - len(rest) :] == rest  # the lines, in order, last
    head = merged[: len(merged) - len(rest)]
    assert all(s.id in done and s.id not in {w.id for w in rest} for s in head)
    assert copies <= {s.id for s in head}  # a line written again unchanged is kept, once
    # every dependency of a kept step is kept, before it
    for i, s in enumerate(head):
        assert set(s.depends_on) <= {k.id for k in head[:i]}
    # a done answer of the old plan stays unless it or a step it was built on is rewritten
    rewritten = {w.id for w in written}
    graph = plan.graph()
    for step_id in kept.answers:
        if not ({step_id} | nx.ancestors(graph, step_id)) & rewritten:
            assert step_id in ids


def test_rendering_a_revision_skips_the_steps_carried_over() -> None:
    done = DoneSteps.of(OLD, {"1", "4"})
    plan = parse_compact('5. lookup("B")\n6. add($1, $5)', goal="g", params=PARAMS, done=done)
    text = render_compact(plan, PARAMS, skip={"1", "4"})
    assert text == '5. lookup("B")\n6. add($1, $5)'
    assert parse_compact(text, goal="g", params=PARAMS, done=done) == plan


def test_a_step_redone_after_a_line_that_used_it_is_refused() -> None:
    old = Plan(goal="g", steps=[call("1", "lookup", key="a"), call("2", "lookup", key="b")])
    done = DoneSteps.of(old, {"1"})
    # line 2 used the done 1's result; redoing 1 below it would change what it meant
    with pytest.raises(PlanParseError, match="step '1' is redone after steps that use"):
        parse_compact('2. add($1, 1)\n1. lookup("A")', goal="g", params=PARAMS, done=done)
    written = Plan(
        goal="g", steps=[call("2", "add", "1", a="$1", b=1), call("1", "lookup", key="A")]
    )
    response = ModelResponse(text="", output=written.model_dump(mode="json"))
    with pytest.raises(PlanParseError, match="redone after"):
        parse_plan_output(response, goal="g", params=PARAMS, done=done)


def test_what_stands_is_found_in_a_plan_the_gate_has_not_seen() -> None:
    cyclic = Plan(
        goal="g",
        steps=[
            call("1", "lookup", key="a"),
            call("p", "lookup", "q", key="p"),
            call("q", "lookup", "p", key="q"),
        ],
    )
    old = Plan(goal="g", steps=[call("1", "lookup", key="a")])
    assert carried_over(old, cyclic, {"1"}) == ["1"]  # no error: the cycle is the gate's to name


def test_a_plan_cut_short_answers_with_none_of_its_done_steps() -> None:
    done = DoneSteps.of(OLD, {"1", "4"}, answers=False)
    plan = parse_compact('5. lookup("B")', goal="g", params=PARAMS, done=done)
    assert [s.id for s in plan.steps] == ["5"]
