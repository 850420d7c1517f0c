"""Plans from anywhere are printed safely: no escape sequence reaches the terminal, and a lone
surrogate (JSON's "\\ud800") is shown, not a UnicodeEncodeError."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from display_support import UNPRINTABLE, render
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hierplan.errors import UserInputError
from hierplan.hierarchy.gate import GateContext
from hierplan.plans.plan import Plan, Step, diff_plans, plan_from_data, validate_plan
from hierplan.review.render import diff_view, plan_review_tree, review_view, step_label
from hierplan.tools.base import Toolbox
from hierplan.view.tree import plan_tree

ESC = "\x1b"
HOSTILE = {
    "clear": "\x1b[2J",
    "title": "\x1b]0;owned\x07",
    "csi": "\x9b31m",
    "bidi": "\u202e",
    "surrogate": "\ud800",
}


def hierplan(*args: str, cwd: Path) -> subprocess.CompletedProcess[bytes]:
    """The command as a person runs it, its output going to pipes encoded as UTF-8."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONIOENCODING", "FORCE_COLOR")}
    env |= {"LC_ALL": "C.UTF-8", "NO_COLOR": "1", "TERM": "dumb", "COLUMNS": "200"}
    return subprocess.run(
        [sys.executable, "-m", "hierplan", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        timeout=120,
        check=False,
    )


def test_validate_prints_a_plan_whose_dependency_is_a_lone_surrogate(tmp_path: Path) -> None:
    (tmp_path / "s.json").write_text(
        '{"goal":"g","steps":[{"id":"a","title":"t","instruction":"i","depends_on":["\\ud800"]}]}'
    )
    done = hierplan("validate", "s.json", cwd=tmp_path)
    out, err = done.stdout.decode(), done.stderr.decode()
    assert "Traceback" not in err and "UnicodeEncodeError" not in err, err
    assert done.returncode == 1, err
    assert "a [task] t  after \ufffd" in out
    assert "problem: step 'a' depends on '\\ud800', which is not a step of this plan" in out


def test_validate_sends_no_escape_sequence_from_a_plan_to_the_terminal(tmp_path: Path) -> None:
    step = {
        "id": "a",
        "title": "title \x1b[2J",
        "instruction": "i",
        "depends_on": ["\x1b]0;owned\x07", "a"],
        "tool": "\x1b[31mtool",
        "tools": ["\x1b[5mother"],
    }
    (tmp_path / "p.json").write_text(json.dumps({"goal": "g \x1b[H", "steps": [step]}))
    done = hierplan("validate", "p.json", "--tools", "x", cwd=tmp_path)
    out = done.stdout.decode() + done.stderr.decode()
    assert done.returncode == 1, out
    assert ESC not in out
    assert "after ␛]0;owned␇, a" in out  # shown as symbols, not sent
    assert "problem: step 'a' depends on '\\x1b]0;owned\\x07'" in out


def test_a_plan_file_with_a_key_that_is_an_escape_sequence_is_refused_printably(
    tmp_path: Path,
) -> None:
    plan = '{"goal":"g","steps":[{"id":"a","title":"t","instruction":"i","\\u001b]0;x\\u0007":1}]}'
    (tmp_path / "k.json").write_text(plan)
    done = hierplan("validate", "k.json", cwd=tmp_path)
    err = done.stderr.decode()
    assert done.returncode == 2 and ESC not in err, err
    assert "steps.0.␛]0;x␇: Extra inputs are not permitted" in " ".join(err.split())


def _hostile_step(text: str) -> Step:
    return Step.model_construct(
        id="a",
        title=f"title {text}",
        instruction="i",
        depends_on=[text, "b"],
        kind="task",
        tool=f"tool{text}",
        args={"q": text},
        tools=[f"other{text}"],
    )


@pytest.mark.parametrize("text", HOSTILE.values(), ids=HOSTILE.keys())
def test_the_review_renderings_show_plan_text_as_symbols(text: str) -> None:
    step = _hostile_step(text)
    old = Plan.model_construct(goal=f"g{text}", steps=[Step(id="b", title="B", instruction="b")])
    new = Plan.model_construct(goal=f"g{text}", steps=[*old.steps, step], rationale=text)
    shown = render(
        step_label(step),
        plan_review_tree(new, title="plan"),
        diff_view(old, new),
        plan_tree(new),
    )
    assert not UNPRINTABLE.search(shown), repr(shown)
    assert "after " in shown and "tools: other" in shown


def test_a_review_shows_the_changes_from_the_plan_it_names_whatever_diff_it_was_given() -> None:
    """The gate's diff may be against another version than the one shown as replaced (a
    refused edit in between): the review shows the changes between the two plans it names."""
    shown_before = Plan.model_construct(
        goal="g", steps=[Step(id="a", title="A", instruction="a")], rationale=""
    )
    refused_edit = Plan.model_construct(
        goal="g", steps=[Step(id="z", title="Z", instruction="z")], rationale=""
    )
    proposal = Plan.model_construct(
        goal="g", steps=[Step(id="b", title="B", instruction="b")], rationale=""
    )
    context = GateContext(
        path="1",
        goal="g",
        depth=1,
        max_depth=3,
        max_steps=50,
        allowed_tools=frozenset(),
        toolbox=Toolbox(),
        version=3,
        reason="retry",
        previous=shown_before,
        diff=diff_plans(refused_edit, proposal),
    )
    shown = render(review_view(proposal, context))
    assert "+ b [task] B" in shown and "- a [task] A" in shown
    assert "z [task]" not in shown


def test_problem_messages_are_printable_whatever_a_validator_quotes() -> None:
    """A validator of someone else's may quote plan text as it is: printed, it is symbols."""
    from hierplan.plans.plan import PlanProblem

    problem = PlanProblem("mine", "step 'a' has \x1b[2J and \ud800 in it", "a")
    assert str(problem) == "step 'a' has ␛[2J and \ufffd in it"


# -- fuzzing: plan data of any text ----------------------------------------------------------

# Any code point, surrogates and controls included (hypothesis leaves surrogates out unless
# told, and draws them rarely then): the ones a terminal acts on, or cannot encode, often.
any_char = st.characters(exclude_categories=()) | st.sampled_from(
    ["\ud800", "\udfff", "\x1b", "\x9b", "\x07", "\x00", "\x7f", "\u202e", "\u2066"]
)
any_text = st.text(any_char, max_size=12) | st.sampled_from(list(HOSTILE.values()))
plan_data = st.fixed_dictionaries(
    {
        "goal": any_text,
        "steps": st.lists(
            st.fixed_dictionaries(
                {
                    "id": st.sampled_from(["a", "b", "c"]) | any_text,
                    "title": any_text,
                    "instruction": any_text,
                },
                optional={
                    "depends_on": st.lists(any_text | st.sampled_from("abc"), max_size=4),
                    "tool": any_text,
                    "tools": st.lists(any_text, max_size=3),
                    "args": st.dictionaries(any_text, any_text, max_size=3),
                    "kind": st.sampled_from(["task", "subgoal"]),
                },
            ),
            max_size=5,
        ),
        "rationale": any_text,
    }
)


def _shown_safely(data: dict[str, Any], earlier: dict[str, Any]) -> None:
    """Whatever the plan data, reading it gives a plan or a printable error, and every
    rendering of the plan and its problems prints (UTF-8, strict) with no control character;
    so does its diff against an earlier plan of any data, however unlike."""
    try:
        plan = plan_from_data(data)
    except UserInputError as exc:
        assert not UNPRINTABLE.search(render(str(exc)))
        return
    try:
        before = plan_from_data(earlier)
    except UserInputError:
        before = plan
    problems = validate_plan(plan, tools=["t"])
    context = GateContext(
        path="1",
        goal=plan.goal,
        depth=1,
        max_depth=3,
        max_steps=50,
        allowed_tools=frozenset({"t"}),
        toolbox=Toolbox(),
        version=2,
        reason="replan",
        previous=before,
        diff=diff_plans(before, plan),
        problems=tuple(str(p) for p in problems),
    )
    shown = render(
        plan_tree(plan),
        review_view(plan, context),
        diff_view(plan, before),
        *(f"problem: {p}" for p in problems),
    )
    assert not UNPRINTABLE.search(shown), repr(shown)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(plan_data, plan_data)
def test_any_plan_data_is_shown_safely(data: dict[str, Any], earlier: dict[str, Any]) -> None:
    _shown_safely(data, earlier)


@pytest.mark.slow
@settings(max_examples=10_000, deadline=None, suppress_health_check=list(HealthCheck))
@given(plan_data, plan_data)
def test_any_plan_data_is_shown_safely_long(data: dict[str, Any], earlier: dict[str, Any]) -> None:
    _shown_safely(data, earlier)
