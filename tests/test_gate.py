"""The gate: validators first, then the approver's approve / edit / reject."""

from __future__ import annotations

import contextvars
import threading
import time
from collections.abc import Iterator, Mapping
from typing import Any

import anyio
import pytest
from tool_support import Declared

import hierplan
from hierplan import (
    Approve,
    CallbackApprover,
    Edit,
    GateContext,
    Plan,
    Reject,
    ScriptedModel,
    Step,
    tool,
)
from hierplan.hierarchy.gate import Gate
from hierplan.models.scripted import plan_response
from hierplan.plans.decisions import Decision
from hierplan.tools.base import Toolbox

pytestmark = pytest.mark.anyio


@tool
def copy(table: str, batch: int = 10) -> str:
    """Copy a table."""
    return f"copied {table}"


def s(sid: str, *deps: str, **extra: Any) -> Step:
    return Step(id=sid, title=sid, instruction=f"step {sid}", depends_on=list(deps), **extra)


def ctx(**extra: Any) -> GateContext:
    base: dict[str, Any] = {
        "path": "1",
        "goal": "g",
        "depth": 1,
        "max_depth": 3,
        "max_steps": 50,
        "allowed_tools": frozenset({"copy"}),
        "toolbox": Toolbox([copy]),
        "version": 1,
        "reason": "initial",
    }
    return GateContext(**{**base, **extra})


GOOD = Plan(goal="g", steps=[s("a", tool="copy", args={"table": "t"})])


async def test_invalid_plans_never_reach_the_approver() -> None:
    seen: list[Plan] = []

    def approve(plan: Plan, context: object) -> Approve:
        seen.append(plan)
        return Approve()

    gate = Gate(CallbackApprover(approve))
    bad = Plan(goal="g", steps=[s("a", "b"), s("b", "a"), s("c", tool="drop", args={})])
    outcome = await gate.review(bad, ctx())
    assert outcome.kind == "invalid" and seen == []
    assert any("cycle" in p for p in outcome.problems)
    assert any("'drop'" in p for p in outcome.problems)


async def test_args_are_checked_against_the_tool_schema() -> None:
    gate = Gate()
    wrong = Plan(goal="g", steps=[s("a", tool="copy", args={"table": 3, "extra": 1})])
    outcome = await gate.review(wrong, ctx())
    assert outcome.kind == "invalid"
    assert "table: expected string, got integer 3" in outcome.problems[0]
    assert "extra: unexpected argument" in outcome.problems[0]


async def test_references_must_name_dependencies() -> None:
    gate = Gate()
    plan = Plan(
        goal="g",
        steps=[s("a", tool="copy", args={"table": "t"}), s("b", tool="copy", args={"table": "$a"})],
    )
    outcome = await gate.review(plan, ctx())
    assert outcome.problems == ["step 'b' uses $a but does not depend on 'a'"]
    ok = Plan(
        goal="g",
        steps=[
            s("a", tool="copy", args={"table": "t"}),
            s("b", "a", tool="copy", args={"table": "$a"}),
        ],
    )
    assert (await gate.review(ok, ctx())).kind == "approved"


async def test_a_reference_to_the_step_itself_is_not_told_to_depend_on_itself() -> None:
    plan = Plan(goal="g", steps=[s("a", tool="copy", args={"table": "$a"})])
    outcome = await Gate().review(plan, ctx())
    assert outcome.problems == [
        "step 'a' uses $a, its own result, which does not exist before it runs: refer to a "
        "step it depends on"
    ]


async def test_a_dollar_amount_or_punctuation_after_a_reference_is_not_a_reference() -> None:
    gate = Gate()
    plan = Plan(
        goal="g",
        steps=[
            s("a", tool="copy", args={"table": "the invoice total is $100, due $5.50"}),
            s("b", "a", tool="copy", args={"table": "Summary: $a."}),
            s("c", tool="copy", args={"table": "after $a-"}),
        ],
    )
    outcome = await gate.review(plan, ctx())
    # $100 and $5.50 are text; "$a." and "$a-" name step a, on which c does not depend
    assert outcome.problems == ["step 'c' uses $a but does not depend on 'a'"]


async def test_edits_are_validated_again_and_an_invalid_edit_goes_back_to_the_approver() -> None:
    attempts: list[tuple[str, ...]] = []
    bad_edit = Plan(goal="g", steps=[s("a", "a")])

    async def review(plan: Plan, c: GateContext) -> Edit:
        attempts.append(c.problems)
        return Edit(bad_edit if len(attempts) == 1 else GOOD, by="alice")

    outcome = await Gate(CallbackApprover(review)).review(GOOD, ctx())
    assert outcome.kind == "edited" and outcome.by == "alice" and outcome.plan == GOOD
    assert attempts[0] == () and "depends on itself" in attempts[1][0]


async def test_an_edit_built_without_the_schema_checks_is_refused() -> None:
    # model_copy(update=...) and model_construct skip field validation: an id that is no id
    # (one no $id reference could name, here) would otherwise reach the run.
    sneaky = GOOD.model_copy(update={"steps": [s("a").model_copy(update={"id": "../x"})]})
    edits = iter([sneaky, GOOD])
    approver = CallbackApprover(lambda p, c: Edit(next(edits), by="dave"))
    outcome = await Gate(approver).review(GOOD, ctx())
    assert outcome.kind == "edited" and outcome.plan == GOOD
    (refused,) = outcome.refused
    assert refused.problems[0].startswith("the edited plan is not a valid plan: steps.0.id:")


async def test_an_edit_of_plain_data_is_a_clear_type_error() -> None:
    approver = CallbackApprover(lambda p, c: Edit({"goal": "g", "steps": []}))  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"Edit needs a Plan, not dict"):
        await Gate(approver).review(GOOD, ctx())


async def test_a_callback_must_return_a_decision() -> None:
    with pytest.raises(TypeError, match="return Approve"):
        await Gate(CallbackApprover(lambda p, c: "yes")).review(GOOD, ctx())  # type: ignore[arg-type,return-value]


async def test_rejections_go_back_to_the_planner_with_the_reason_and_are_bounded() -> None:
    reasons = iter(["too risky", "still risky"])
    approver = CallbackApprover(lambda p, c: Reject(next(reasons, "no"), by="bob"))
    model = ScriptedModel([plan_response(GOOD)] * 3)
    result = await hierplan.run(
        "g",
        model=model,
        tools=[copy],
        approver=approver,
        settings=hierplan.RunSettings(max_rejections=2),
    )
    model.assert_complete()
    assert result.status == "rejected"
    assert (
        "The reviewer rejected your last plan: too risky" in model.requests[1].messages[1].content
    )
    versions = result.tree.plan_versions
    assert [(v.decision, v.decided_by) for v in versions] == [("rejected", "bob")] * 3
    assert result.tree.children == []  # nothing ran


async def test_an_edit_replaces_the_plan_and_both_versions_are_kept() -> None:
    edited = Plan(goal="g", steps=[s("b", tool="copy", args={"table": "edited"})])
    approver = CallbackApprover(lambda p, c: Edit(edited, by="carol", note="safer"))
    model = ScriptedModel([plan_response(GOOD)])
    result = await hierplan.run("g", model=model, tools=[copy], approver=approver)
    assert result.status == "succeeded" and result.answer == "copied edited"
    first, second = result.tree.plan_versions
    assert (first.decision, first.decided_by) == ("edited", "carol")
    assert (second.reason, second.decision, second.plan) == ("edit", "approved", edited)
    assert second.diff is not None and second.diff.added == ("b",)


# -- sync review functions run off the event loop ------------------------------------------


async def test_a_blocking_sync_reviewer_does_not_hold_up_other_tasks() -> None:
    ticks: list[float] = []
    released = threading.Event()

    def blocking_review(plan: Plan, context: GateContext) -> Approve:
        # Blocks its thread (as input() would) until the other task has run a while.
        assert released.wait(timeout=5)
        return Approve(by="slow-human")

    async def ticker() -> None:
        for _ in range(5):
            ticks.append(time.monotonic())
            await anyio.sleep(0.01)
        released.set()

    outcomes = []
    async with anyio.create_task_group() as tg:

        async def review() -> None:
            outcomes.append(await Gate(CallbackApprover(blocking_review)).review(GOOD, ctx()))

        tg.start_soon(review)
        tg.start_soon(ticker)
    assert len(ticks) == 5
    assert outcomes[0].kind == "approved" and outcomes[0].by == "slow-human"


async def test_the_timeout_applies_to_a_sync_reviewer() -> None:
    released = threading.Event()

    def stuck_review(plan: Plan, context: GateContext) -> Approve:
        released.wait(timeout=5)
        return Approve()

    approver = CallbackApprover(stuck_review, name="desk", timeout_s=0.05)
    started = time.monotonic()
    try:
        outcome = await Gate(approver).review(GOOD, ctx())
    finally:
        released.set()
    assert time.monotonic() - started < 2
    assert (outcome.kind, outcome.by) == ("pending", "desk")
    assert "no decision within 0.05 s" in outcome.note


REVIEWER: contextvars.ContextVar[str] = contextvars.ContextVar("REVIEWER", default="nobody")


async def test_a_sync_reviewer_sees_the_callers_context_variables() -> None:
    seen: list[tuple[str, bool]] = []

    def review(plan: Plan, context: GateContext) -> Approve:
        seen.append((REVIEWER.get(), threading.current_thread() is threading.main_thread()))
        return Approve(by=REVIEWER.get())

    token = REVIEWER.set("erin")
    try:
        outcome = await Gate(CallbackApprover(review)).review(GOOD, ctx())
    finally:
        REVIEWER.reset(token)
    assert seen == [("erin", False)]  # the caller's value, in a thread of its own
    assert outcome.by == "erin"


async def test_a_sync_reviewers_error_reaches_the_caller() -> None:
    def broken(plan: Plan, context: GateContext) -> Approve:
        raise RuntimeError("reviewer crashed")

    with pytest.raises(RuntimeError, match="reviewer crashed"):
        await Gate(CallbackApprover(broken)).review(GOOD, ctx())


# -- refused edits say who made them -------------------------------------------------------

CYCLIC = Plan(goal="g", steps=[s("a", "b"), s("b", "a")])


async def test_a_refused_edit_names_the_reviewer_who_made_it() -> None:
    decisions = iter([Edit(CYCLIC, by="dave"), Edit(GOOD, by="erin")])
    outcome = await Gate(CallbackApprover(lambda p, c: next(decisions))).review(GOOD, ctx())
    assert (outcome.kind, outcome.by) == ("edited", "erin")
    (refused,) = outcome.refused
    assert refused.by == "dave" and refused.message == "edit by dave refused"


async def test_an_edit_the_approver_checked_itself_is_put_down_to_whoever_it_names() -> None:
    def review(plan: Plan, context: GateContext) -> Approve:
        assert context.validate(CYCLIC, by="frank")  # named
        assert context.validate(s_plan("x", "x"))  # unnamed: whoever decides next
        return Approve(by="grace")

    outcome = await Gate(CallbackApprover(review)).review(GOOD, ctx())
    assert [(r.by, r.message) for r in outcome.refused] == [
        ("frank", "edit by frank refused"),
        ("grace", "edit by grace refused"),
    ]


def s_plan(sid: str, *deps: str) -> Plan:
    return Plan(goal="g", steps=[s(sid, *deps)])


async def test_the_record_of_a_refused_edit_says_who_made_it_not_who_decided_last() -> None:
    decisions: Iterator[Decision] = iter([Edit(CYCLIC, by="dave"), Approve(by="boss")])
    model = ScriptedModel([plan_response(GOOD)])
    result = await hierplan.run(
        "g", model=model, tools=[copy], approver=CallbackApprover(lambda p, c: next(decisions))
    )
    assert result.status == "succeeded"
    refused = [v for v in result.tree.plan_versions if v.decision == "invalid"]
    assert [(v.decided_by, v.note) for v in refused] == [("validators", "edit by dave refused")]


# -- a plan an approver changed in place -------------------------------------------------


class Counted(Declared):
    """A tool with a declared schema (no conversion of its own, as an MCP tool), keeping the
    ``n`` of every call."""

    def __init__(self) -> None:
        super().__init__("counted")
        self.got: list[Any] = []

    async def invoke(self, arguments: Mapping[str, Any]) -> Any:
        self.got.append(arguments["n"])
        return f"counted {arguments['n']}"


COUNTED = Plan(goal="g", steps=[s("a", tool="counted", args={"n": 1})])


def counted_ctx(counted: Counted) -> GateContext:
    return ctx(toolbox=Toolbox([counted]), allowed_tools=frozenset({"counted"}))


def in_place(values: list[Any], seen: list[tuple[str, ...]]) -> CallbackApprover:
    """An approver that sets the first step's ``n`` to the next of ``values`` and approves."""

    def review(plan: Plan, context: GateContext) -> Approve:
        seen.append(context.problems)
        assert plan.steps[0].args is not None
        plan.steps[0].args["n"] = values[len(seen) - 1]
        return Approve(by="erin")

    return CallbackApprover(review)


async def test_arguments_an_approver_changed_in_place_are_its_edit_checked_again() -> None:
    plan, seen = COUNTED.model_copy(deep=True), list[tuple[str, ...]]()
    outcome = await Gate(in_place(["two", 2], seen)).review(plan, counted_ctx(Counted()))
    assert (outcome.kind, outcome.by, outcome.plan.steps[0].args) == ("edited", "erin", {"n": 2})
    assert seen[0] == () and "n: expected integer, got string 'two'" in seen[1][0]
    [refused] = outcome.refused
    assert (refused.by, refused.plan.steps[0].args) == ("erin", {"n": "two"})
    assert plan == COUNTED  # what the planner proposed is as it was


async def test_a_plan_approved_unchanged_is_the_plan_proposed() -> None:
    shown: list[Plan] = []

    def review(plan: Plan, context: GateContext) -> Approve:
        shown.append(plan)
        return Approve(by="erin")

    outcome = await Gate(CallbackApprover(review)).review(COUNTED, counted_ctx(Counted()))
    assert (outcome.kind, outcome.by, outcome.refused) == ("approved", "erin", [])
    # The approver saw a copy; what runs is the very plan the gate checked.
    assert shown == [COUNTED] and shown[0] is not COUNTED and outcome.plan is COUNTED


async def test_a_step_never_runs_with_arguments_changed_past_the_check() -> None:
    counted, seen = Counted(), list[tuple[str, ...]]()
    model = ScriptedModel([plan_response(COUNTED)])
    approver = in_place(["two", 2], seen)
    result = await hierplan.run("g", model=model, tools=[counted], approver=approver)
    assert (result.status, result.answer, counted.got) == ("succeeded", "counted 2", [2])
    versions = [
        (v.reason, v.decision, v.decided_by, v.plan.steps[0].args)
        for v in result.tree.plan_versions
    ]
    assert versions == [
        ("initial", "edited", "erin", {"n": 1}),
        ("edit", "invalid", "validators", {"n": "two"}),
        ("edit", "approved", "erin", {"n": 2}),
    ]


async def test_a_thread_left_behind_cannot_change_what_runs() -> None:
    counted, changed = Counted(), threading.Event()

    @tool
    async def wait() -> str:
        """Wait until the late reviewer has changed its plan."""
        await anyio.to_thread.run_sync(changed.wait, 5)
        return "waited"

    def review(plan: Plan, context: GateContext) -> Approve:
        time.sleep(0.2)  # past the timeout: the gate has approved meanwhile
        assert plan.steps[1].args is not None
        plan.steps[1].args["n"] = "two"
        changed.set()
        return Approve(by="late")

    steps = [s("a", tool="wait", args={}), s("b", "a", tool="counted", args={"n": 1})]
    plan = Plan(goal="g", steps=steps)
    approver = CallbackApprover(review, timeout_s=0.05, on_timeout=Approve(by="timeout"))
    model = ScriptedModel([plan_response(plan)])
    result = await hierplan.run("g", model=model, tools=[wait, counted], approver=approver)
    assert changed.is_set()
    assert (result.status, counted.got) == ("succeeded", [1])


async def test_what_a_timed_out_reviewer_changed_so_far_is_not_approved() -> None:
    counted, started, done = Counted(), threading.Event(), threading.Event()

    def review(plan: Plan, context: GateContext) -> Reject:
        assert plan.steps[0].args is not None
        plan.steps[0].args["n"] = 2  # a draft: the reviewer is still deciding
        started.set()
        done.wait(5)
        return Reject("too late to matter")

    @tool
    async def finish() -> str:
        """Let the reviewer's thread end."""
        done.set()
        return "done"

    steps = [s("a", tool="counted", args={"n": 1}), s("b", "a", tool="finish", args={})]
    model = ScriptedModel([plan_response(Plan(goal="g", steps=steps))])
    timeout = Approve(by="timeout", note="approved as proposed")
    # Time enough for the thread to make its draft: the timeout decides on a plan it changed.
    approver = CallbackApprover(review, timeout_s=0.5, on_timeout=timeout)
    result = await hierplan.run("g", model=model, tools=[counted, finish], approver=approver)
    assert started.is_set() and (result.status, counted.got) == ("succeeded", [1])
    versions = [(v.decision, v.decided_by, v.note) for v in result.tree.plan_versions]
    assert versions == [("approved", "timeout", "approved as proposed")]


async def test_a_reviewer_that_checks_its_copy_fixes_it_and_checks_again_is_told_so() -> None:
    checks: list[list[str]] = []

    def review(plan: Plan, context: GateContext) -> Approve:
        plan.steps[0].depends_on.append("a")
        checks.append([str(p) for p in context.validate(plan)])
        plan.steps[0].depends_on.clear()
        checks.append([str(p) for p in context.validate(plan)])
        return Approve(by="erin")

    outcome = await Gate(CallbackApprover(review)).review(GOOD.model_copy(deep=True), ctx())
    assert checks == [["step 'a' depends on itself"], []]
    assert (outcome.kind, outcome.plan) == ("approved", GOOD)
    [refused] = outcome.refused
    assert (refused.by, refused.plan.steps[0].depends_on) == ("erin", ["a"])


async def test_a_plan_whose_arguments_cannot_be_copied_is_shown_as_it_is() -> None:
    lock = threading.Lock()
    plan = Plan(goal="g", steps=[s("a", tool="copy", args={"lock": lock})])
    shown: list[Plan] = []

    def review(p: Plan, context: GateContext) -> Approve:
        shown.append(p)
        return Approve(by="erin")

    outcome = await Gate(CallbackApprover(review), validators=[]).review(plan, ctx())
    assert (outcome.kind, outcome.plan) == ("approved", plan) and shown[0] is plan


async def test_a_dependency_an_approver_added_in_place_is_checked_too() -> None:
    seen: list[tuple[str, ...]] = []

    def review(plan: Plan, context: GateContext) -> Approve:
        seen.append(context.problems)
        if len(seen) == 1:
            plan.steps[0].depends_on.append("a")
        return Approve(by="erin")

    proposed = GOOD.model_copy(deep=True)  # GOOD itself stays as it is, whatever the gate does
    outcome = await Gate(CallbackApprover(review)).review(proposed, ctx())
    assert (outcome.kind, outcome.plan) == ("approved", GOOD)
    assert "depends on itself" in seen[1][0]


async def test_an_approver_that_keeps_breaking_the_arguments_has_its_plan_rejected() -> None:
    seen: list[tuple[str, ...]] = []
    gate = Gate(in_place(["two"] * 3, seen), max_edit_rounds=3)
    outcome = await gate.review(COUNTED.model_copy(deep=True), counted_ctx(Counted()))
    assert outcome.kind == "rejected" and len(seen) == 3
    assert "n: expected integer" in outcome.note


@pytest.mark.parametrize("timeout_s", [0, -1.0, float("nan"), True, "5"])
def test_a_callback_approver_refuses_a_timeout_that_is_no_deadline(timeout_s: Any) -> None:
    with pytest.raises(hierplan.UserInputError) as refused:
        CallbackApprover(lambda plan, context: Approve(), name="desk", timeout_s=timeout_s)
    assert str(refused.value) == (
        "CallbackApprover 'desk': timeout_s must be None or a number of seconds more than 0, "
        f"not {timeout_s!r}"
    )
    # No deadline at all is None, or math.inf.
    CallbackApprover(lambda plan, context: Approve(), timeout_s=float("inf"))


def test_a_plan_s_structure_is_worked_out_once_for_the_validators_that_ask(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import dataclasses

    from hierplan.plans.plan import validate_plan as real

    calls: list[Plan] = []

    def counted(plan: Plan, **limits: Any) -> Any:
        calls.append(plan)
        return real(plan, **limits)

    monkeypatch.setattr("hierplan.hierarchy.gate.validate_plan", counted)
    costed: list[Plan] = []

    def budget_check(plan: Plan) -> list[hierplan.PlanProblem]:
        costed.append(plan)
        return []

    context = ctx(budget_check=budget_check)
    assert Gate().validate(GOOD, context) == []
    assert calls == [GOOD] and costed == [GOOD]  # the structure validator's, then the budget's
    # Another plan, or the same plan under other limits, is worked out again.
    broken = Plan(goal="g", steps=[s("a", "b")])
    assert [p.code for p in Gate().validate(broken, context)] == ["dangling_dependency"]
    assert calls == [GOOD, broken] and costed == [GOOD]  # a broken plan is not costed
    narrower = dataclasses.replace(context, allowed_tools=frozenset())
    assert [p.code for p in Gate().validate(GOOD, narrower)] == ["unknown_tool"]
    assert calls == [GOOD, broken, GOOD]
