"""Review policies, the gate's outside decisions and refused edits, and what a reviewer sees."""

from __future__ import annotations

import dataclasses
import io
import time
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from review_support import ROOT_GOAL, fanout_planner, part_goal, recording_tool
from rich.console import Console

import hierplan
from hierplan import Approve, CallbackApprover, Defer, Edit, GateContext, Plan, Reject
from hierplan.core.events import PlanDecided, RunEvent
from hierplan.errors import UserInputError
from hierplan.hierarchy.gate import Gate
from hierplan.plans.plan import Step, diff_plans
from hierplan.review import PolicyApprover, ReviewPolicy
from hierplan.review.policy import subgoal_budget
from hierplan.review.render import diff_view, plan_review_tree, review_view, waves
from hierplan.tools.base import Toolbox


def _ctx(
    depth: int = 2, step: Step | None = None, budget: dict[str, Any] | None = None
) -> GateContext:
    return GateContext(
        path="1" if depth == 1 else "1.2",
        goal="g",
        depth=depth,
        max_depth=3,
        max_steps=50,
        allowed_tools=frozenset(),
        toolbox=Toolbox(),
        version=1,
        reason="initial",
        step=step,
        budget=budget,
    )


def _sub(usd: float | None = None, tokens: int | None = None) -> Step:
    return Step(
        id="s",
        title="S",
        instruction="s",
        kind="subgoal",
        estimate_usd=usd,
        estimate_tokens=tokens,
    )


def test_policy_parse_and_text() -> None:
    assert ReviewPolicy.parse("root") == ReviewPolicy("root")
    assert ReviewPolicy.parse(" ALL ") == ReviewPolicy("all")
    assert ReviewPolicy.parse("usd>0.05") == ReviewPolicy("usd", 0.05)
    assert ReviewPolicy.parse("usd > $1.5") == ReviewPolicy("usd", 1.5)
    assert ReviewPolicy.parse("tokens>20000") == ReviewPolicy("tokens", 20000)
    assert [str(ReviewPolicy.parse(t)) for t in ("root", "all", "usd>0.05", "tokens>20000")] == [
        "root",
        "all",
        "usd>0.05",
        "tokens>20000",
    ]
    for bad in ("", "sometimes", "usd>", "tokens<5", "budget>3", "usd>abc"):
        with pytest.raises(UserInputError, match="unknown review policy"):
            ReviewPolicy.parse(bad)


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("usd>-1", "the USD amount must not be negative"),  # was "unknown review policy"
        ("tokens>-5", "the token count must not be negative"),
        ("usd>nan", "the USD amount must be a finite number"),
        ("usd>inf", "the USD amount must be a finite number"),
        ("usd>1e400", "the USD amount must be a finite number"),
        ("tokens>1e400", "the token count must be a finite number"),
        ("tokens>1.5", "the token count must be a whole number"),
    ],
)
def test_a_policy_threshold_that_is_no_usable_number_is_refused(text: str, problem: str) -> None:
    with pytest.raises(UserInputError) as refused:
        ReviewPolicy.parse(text)
    message = str(refused.value)
    assert message.startswith(f"review policy {text!r}: {problem}")
    assert "; use root, all, destructive, usd>AMOUNT or tokens>COUNT" in message


def test_a_whole_token_count_in_any_notation_and_a_precise_amount_round_trip() -> None:
    assert ReviewPolicy.parse("tokens>2e4") == ReviewPolicy("tokens", 20000)
    precise = ReviewPolicy.parse("usd>0.123456789")
    assert str(precise) == "usd>0.123456789" and ReviewPolicy.parse(str(precise)) == precise


_NUMBERS = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True).map(repr),
    st.integers().map(str),
    st.from_regex(r"\A-?[0-9_]{0,6}(\.[0-9]{0,4})?([eE][+-]?[0-9]{1,4})?\Z"),
    st.sampled_from(["nan", "inf", "-inf", "1e400", "-0", "$1", "1_000", "0x10", "½"]),
    st.text(max_size=12),
)


@given(
    st.sampled_from(["usd", "tokens", "USD ", " Tokens"]), st.sampled_from([">", " > "]), _NUMBERS
)
def test_a_threshold_of_any_text_gives_a_policy_or_the_policy_error(
    unit: str, sep: str, number: str
) -> None:
    text = f"{unit}{sep}{number}"
    try:
        policy = ReviewPolicy.parse(text)
    except UserInputError as exc:
        assert "use root, all, destructive, usd>AMOUNT or tokens>COUNT" in str(exc)
    else:
        assert ReviewPolicy.parse(str(policy)) == policy


@given(st.text(max_size=40))
def test_policy_parse_never_fails_otherwise(text: str) -> None:
    try:
        policy = ReviewPolicy.parse(text)
    except UserInputError as exc:
        assert "use root, all, destructive, usd>AMOUNT or tokens>COUNT" in str(exc)
    else:
        assert ReviewPolicy.parse(str(policy)) == policy


def test_policy_selects_plans() -> None:
    root, unknown = _ctx(depth=1), _ctx(step=_sub())
    cheap, costly = _ctx(step=_sub(0.01, 1000)), _ctx(step=_sub(0.5, 90_000))
    assert ReviewPolicy("root").wants(root) and not ReviewPolicy("root").wants(costly)
    assert ReviewPolicy("all").wants(cheap)
    usd = ReviewPolicy("usd", 0.1)
    assert usd.wants(root) and usd.wants(costly) and not usd.wants(cheap)
    assert usd.wants(unknown)  # an unknown cost is reviewed
    tokens = ReviewPolicy("tokens", 5000)
    assert tokens.wants(costly) and not tokens.wants(cheap)
    # An allocated node budget wins over the planner's estimate, whatever its shape.
    for budget in (
        {"allocated_usd": 0.5},
        {"usd": {"allocated": 0.5}},
        {"allocated": {"usd": 0.5}},
    ):
        ctx = _ctx(step=_sub(0.01), budget=budget)
        assert subgoal_budget(ctx, "usd") == 0.5 and usd.wants(ctx)
    assert not usd.wants(_ctx(step=_sub(0.9), budget={"usd_limit": 0.01}))


def test_a_token_estimate_counts_as_dollars_at_the_dearest_price_for_a_usd_policy() -> None:
    usd = ReviewPolicy("usd", 0.005)
    priced = dataclasses.replace(_ctx(step=_sub(tokens=2000)), usd_per_token=2e-6)
    assert subgoal_budget(priced, "usd") == pytest.approx(0.004) and not usd.wants(priced)
    assert usd.wants(dataclasses.replace(priced, step=_sub(tokens=3000)))
    # A dollar estimate is taken as given; without a price the tokens say nothing in dollars.
    assert subgoal_budget(dataclasses.replace(priced, step=_sub(0.5, 10)), "usd") == 0.5
    assert subgoal_budget(_ctx(step=_sub(tokens=10)), "usd") is None
    assert subgoal_budget(priced, "tokens") == 2000


@pytest.mark.anyio
@pytest.mark.parametrize(
    ("price_out", "reviewed"), [(2.0, ["1", "1.3"]), (None, ["1", "1.1", "1.2", "1.3"])]
)
async def test_a_usd_policy_without_a_run_budget_reviews_the_sub_goals_estimated_above_it(
    price_out: float | None, reviewed: list[str]
) -> None:
    """Sub-goals estimated at 1,000, 2,000 and 3,000 tokens; at $2 per million output tokens
    only the last is over $0.005. Without prices every sub-goal's cost is unknown."""
    seen: list[str] = []

    async def reviewer(plan: Plan, ctx: GateContext) -> Approve:
        seen.append(ctx.path)
        return Approve(by="person")

    result = await hierplan.run(
        hierplan.RunSpec(
            goal=ROOT_GOAL,
            model=fanout_planner(3),
            price_in=None if price_out is None else 0.25,
            price_out=price_out,
        ),
        tools=[recording_tool([])],
        approver=PolicyApprover(CallbackApprover(reviewer), "usd>0.005"),
    )
    assert result.status == "succeeded", result.error
    assert sorted(seen) == reviewed


@pytest.mark.anyio
async def test_policy_approver_names_the_policy() -> None:
    seen: list[str] = []

    async def reviewer(plan: Plan, ctx: GateContext) -> Approve:
        seen.append(ctx.path)
        return Approve(by="person")

    approver = PolicyApprover(CallbackApprover(reviewer), "tokens>5000")
    plan = Plan(goal="g", steps=[Step(id="a", title="A", instruction="a")])
    assert await approver.review(plan, _ctx(step=_sub(tokens=100))) == Approve(
        by="auto (review policy tokens>5000)"
    )
    assert await approver.review(plan, _ctx(depth=1)) == Approve(by="person")
    assert seen == ["1"]


@pytest.mark.anyio
async def test_gate_takes_an_outside_decision_and_keeps_refused_edits() -> None:
    plan = Plan(goal="g", steps=[Step(id="a", title="A", instruction="a")])
    bad = Plan(goal="g", steps=[Step(id="a", title="A", instruction="a", depends_on=["a"])])
    good = Plan(goal="g", steps=[Step(id="b", title="B", instruction="b")])
    answers: list[Any] = [Edit(good, by="p")]
    gate = Gate(CallbackApprover(lambda p, c: answers.pop(0)))
    outcome = await gate.review(plan, _ctx(depth=1), Edit(bad, by="p"))
    assert (outcome.kind, outcome.plan, outcome.by) == ("edited", good, "p")
    assert [r.plan for r in outcome.refused] == [bad]
    assert outcome.refused[0].problems == ("step 'a' depends on itself",)
    assert (await gate.review(plan, _ctx(depth=1), Defer(by="x"))).kind == "pending"
    assert (await gate.review(plan, _ctx(depth=1), Reject("no", by="y"))).note == "no"


@pytest.mark.anyio
async def test_callback_returning_junk_is_a_clear_error() -> None:
    approver = CallbackApprover(lambda p, c: "yes", name="bot")  # type: ignore[arg-type,return-value]
    with pytest.raises(TypeError, match="review callback 'bot' returned 'yes'"):
        await approver.review(Plan(goal="g", steps=[]), _ctx())


@pytest.mark.anyio
async def test_every_edit_attempt_and_decision_is_in_the_record_and_the_events(
    tmp_path: Path,
) -> None:
    """An approver that checks an invalid edit first: both edits are audited."""
    events: list[RunEvent] = []

    async def review(plan: Plan, ctx: GateContext) -> Approve | Edit:
        if not ctx.is_root:
            return Approve(by="auto")
        cyclic = plan.model_copy(
            update={
                "steps": [
                    plan.steps[0].model_copy(update={"depends_on": ["part2"]}),
                    plan.steps[1].model_copy(update={"depends_on": ["part1"]}),
                ]
            }
        )
        assert ctx.validate(cyclic)  # refused, and remembered
        return Edit(plan.model_copy(update={"steps": plan.steps[:1]}), by="console:zoe")

    started = time.time()
    result = await hierplan.run(
        ROOT_GOAL,
        model=fanout_planner(2),
        tools=[recording_tool([])],
        approver=CallbackApprover(review),
        listeners=[events.append],
    )
    assert result.status == "succeeded", result.error
    versions = result.tree.plan_versions
    assert [(v.version, v.reason, v.decision, v.decided_by) for v in versions] == [
        (1, "initial", "edited", "console:zoe"),
        (2, "edit", "invalid", "validators"),
        (3, "edit", "approved", "console:zoe"),
    ]
    assert versions[1].problems == ["dependency cycle among steps: part1 -> part2 -> part1"]
    assert versions[1].note == "edit by console:zoe refused"
    assert versions[2].diff is not None and versions[2].diff.removed == ("part2",)
    assert all(started <= (v.decided_at or 0) <= time.time() for v in versions)
    decided = [(e.path, e.version, e.decision) for e in events if isinstance(e, PlanDecided)]
    assert decided[:3] == [("1", 1, "edited"), ("1", 2, "invalid"), ("1", 3, "approved")]
    assert [c.goal for c in result.tree.children] == [part_goal(1)]


def test_waves_tree_and_diff_show_what_changed() -> None:
    old = Plan(
        goal="g",
        steps=[
            Step(id="a", title="A", instruction="a"),
            Step(id="b", title="B", instruction="b", depends_on=["a"]),
            Step(id="c", title="C", instruction="c", kind="subgoal", estimate_usd=0.25),
        ],
    )
    new = Plan(
        goal="g",
        steps=[
            Step(id="a", title="A", instruction="a"),
            Step(id="b", title="B2", instruction="b"),
            Step(id="d", title="D", instruction="d", tool="t", args={"x": 1}, depends_on=["b"]),
        ],
    )
    assert [[s.id for s in w] for w in waves(old)] == [["a", "c"], ["b"]]
    console = Console(file=io.StringIO(), width=120, color_system=None)
    console.print(plan_review_tree(old, title="plan v1"))
    console.print(diff_view(old, new))
    text = console.file.getvalue()  # type: ignore[attr-defined]
    assert "wave 1 (2 in parallel)" in text
    assert "c [subgoal] C  est. $0.2500" in text
    assert "b [task] B  after a" in text
    assert "changes: +1 -1 ~1 (added: d; removed: c; changed: b)" in text
    assert '+ d [task] D  tool=t {"x": 1}  after b' in text
    assert "- c [subgoal] C" in text
    assert '~ b: title: "B" → "B2"; depends_on: ["a"] → []' in text


def test_review_view_after_a_rejection() -> None:
    old = Plan(goal="g", steps=[Step(id="a", title="A", instruction="a")])
    new = Plan(goal="g", steps=[Step(id="b", title="B", instruction="b")])
    ctx = GateContext(
        path="1.3",
        goal="the goal",
        depth=2,
        max_depth=3,
        max_steps=50,
        allowed_tools=frozenset(),
        toolbox=Toolbox(),
        version=2,
        reason="retry",
        previous=old,
        diff=diff_plans(old, new),
        budget={"usd": 0.5},
        step=_sub(tokens=7000),
    )
    console = Console(file=io.StringIO(), width=120, color_system=None)
    console.print(review_view(new, ctx, rejected="too slow"))
    text = console.file.getvalue()  # type: ignore[attr-defined]
    assert "Review: plan for node 1.3 (depth 2), version 2 (retry)" in text
    assert "SIMULATED" not in text  # a plan from a real model (or a test double)
    console.print(review_view(new, dataclasses.replace(ctx, simulated=True)))
    assert "version 2 (retry) [SIMULATED: proposed by the offline simulator]" in (
        console.file.getvalue()  # type: ignore[attr-defined]
    )
    assert "node budget: usd 0.5" in text
    assert "planner's estimate for this sub-goal: est. 7,000 tok" in text
    assert "replaces the previous proposal, which was rejected: too slow" in text
    assert "changes: +1 -1 ~0 (added: b; removed: a)" in text


@pytest.mark.anyio
@pytest.mark.parametrize("allocation", ["equal", "on-demand"])
async def test_a_budget_policy_weighs_each_subgoal_by_what_it_may_spend(allocation: str) -> None:
    # Each sub-goal of a 1,000,000-token run may spend far more than 100 tokens: an on-demand
    # sub-goal is allocated nothing up front, but its cap is what it may draw.
    reviewed: list[str] = []

    async def reviewer(plan: Plan, ctx: GateContext) -> Approve:
        reviewed.append(ctx.path)
        return Approve(by="person")

    calls: list[str] = []
    result = await hierplan.run(
        ROOT_GOAL,
        model=fanout_planner(3),
        tools=[recording_tool(calls)],
        strategy="hierarchical",
        approver=PolicyApprover(CallbackApprover(reviewer), "tokens>100"),
        budget={"tokens": 1_000_000, "allocation": allocation},
    )
    assert result.status == "succeeded", result.error
    assert sorted(reviewed) == ["1", "1.1", "1.2", "1.3"]
