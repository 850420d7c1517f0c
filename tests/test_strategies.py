"""Every strategy on strict scripted models: the exact calls each one makes, and its tree."""

from __future__ import annotations

from typing import Any

import anyio
import pytest

import hierplan
from hierplan import Plan, RunResult, ScriptedModel, Step, tool
from hierplan.models.base import ModelRequest
from hierplan.models.scripted import plan_response, text_response, tool_response

pytestmark = pytest.mark.anyio


@tool
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


@tool
async def slow_add(a: int, b: int) -> int:
    """Add after a short wait."""
    await anyio.sleep(0.05)
    return a + b


@tool
def broken(x: int) -> int:
    """Always fails."""
    raise RuntimeError(f"broken on {x}")


TOOLS = [add, slow_add, broken]


def s(sid: str, *deps: str, **extra: Any) -> Step:
    return Step(id=sid, title=sid, instruction=f"step {sid}", depends_on=list(deps), **extra)


def plan(*steps: Step, goal: str = "the goal") -> Plan:
    return Plan(goal=goal, steps=list(steps))


async def go(model: ScriptedModel, strategy: str, **settings: Any) -> RunResult:
    """Run ``the goal`` on ``model`` with ``strategy`` and the run ``settings`` given."""
    result = await hierplan.run(
        "the goal",
        model=model,
        strategy=strategy,
        tools=TOOLS,
        settings={"retry_backoff_s": 0, **settings},
    )
    model.assert_complete()
    return result


def purposes(model: ScriptedModel) -> list[str]:
    return [r.purpose for r in model.requests]


async def test_react_is_one_tool_loop() -> None:
    model = ScriptedModel([tool_response(("add", {"a": 2, "b": 3})), text_response("five")])
    result = await go(model, "react")
    assert (result.status, result.answer) == ("succeeded", "five")
    assert result.tree.kind == "executor" and result.tree.children == []
    assert purposes(model) == ["react", "react"]
    # the tool result went back to the model
    assert model.requests[1].messages[-1].content == "5"


async def test_plan_execute_plans_once_and_runs_steps_one_at_a_time() -> None:
    model = ScriptedModel(
        [
            plan_response(
                plan(
                    s("a", tool="slow_add", args={"a": 1, "b": 2}),
                    s("b", tool="slow_add", args={"a": 3, "b": 4}),
                    s("c", "a", "b"),
                )
            ),
            text_response("done: 3 and 7"),
        ]
    )
    result = await go(model, "plan-execute")
    assert result.status == "succeeded" and result.answer == "done: 3 and 7"
    assert purposes(model) == ["plan", "execute"]
    a, b, _ = result.tree.children
    assert a.output == "3" and b.output == "7"
    assert a.finished_at is not None and b.started_at is not None
    assert a.finished_at <= b.started_at  # sequential
    # the executor of c saw its inputs
    assert '"a": "3"' in model.requests[1].messages[1].content


async def test_plan_execute_never_replans() -> None:
    model = ScriptedModel(
        [
            plan_response(
                plan(
                    s("a", tool="broken", args={"x": 1}), s("b", tool="add", args={"a": 1, "b": 1})
                )
            )
        ]
    )
    result = await go(model, "plan-execute")
    assert result.status == "partial"
    assert [c.status for c in result.tree.children] == ["failed", "succeeded"]
    assert result.tree.children[0].attempts == 3  # two retries
    assert "broken on 1" in (result.error or "")


async def test_replan_strategy_replans_after_every_step() -> None:
    first = plan(
        s("a", tool="add", args={"a": 1, "b": 1}),
        s("b", "a", tool="add", args={"a": "$a", "b": 10}),
    )
    model = ScriptedModel([plan_response(first), plan_response(first)])
    result = await go(model, "replan")
    assert result.status == "succeeded" and result.answer == "12"
    assert purposes(model) == ["plan", "replan"]
    replan_prompt = model.requests[1].messages[1].content
    assert "PROGRESS" in replan_prompt and '"a": "2"' in replan_prompt
    assert [v.reason for v in result.tree.plan_versions] == ["initial", "replan"]


async def test_dag_runs_in_parallel_and_replans_on_failure_keeping_done_steps() -> None:
    bad = plan(
        s("x", tool="slow_add", args={"a": 1, "b": 1}),
        s("y", tool="slow_add", args={"a": 2, "b": 2}),
        s("z", "x", "y", tool="broken", args={"x": 0}),
    )
    fixed = plan(
        s("x", tool="slow_add", args={"a": 1, "b": 1}),
        s("y", tool="slow_add", args={"a": 2, "b": 2}),
        s("z2", "x", "y", tool="add", args={"a": "$x", "b": "$y"}),
    )
    model = ScriptedModel([plan_response(bad), plan_response(fixed)])
    result = await go(model, "dag")
    assert result.status == "succeeded" and result.answer == "6"
    x, y, z, z2 = result.tree.children
    assert (x.status, y.status, z.status, z2.status) == ("succeeded",) * 2 + ("failed", "succeeded")
    assert x.started_at is not None and y.finished_at is not None and x.started_at < y.finished_at
    assert [c.path for c in result.tree.children] == ["1.1", "1.2", "1.3", "1.4"]
    failure_text = model.requests[1].messages[1].content
    assert "FAILURE: step 'z' failed" in failure_text
    assert result.tree.plan_versions[1].diff is not None
    assert result.tree.plan_versions[1].diff.summary() == "+1 -1 ~0 (added: z2; removed: z)"


async def test_a_replan_keeps_finished_work_by_what_it_does_not_by_its_wording() -> None:
    charged: list[int] = []

    @tool
    def charge(amount: int) -> str:
        """Charge the card."""
        charged.append(amount)
        return f"charged {amount}"

    first = plan(
        Step(id="pay", title="Charge", instruction="charge", tool="charge", args={"amount": 10}),
        s("a", tool="add", args={"a": 1, "b": 1}),
        s("b", "a", tool="add", args={"a": "$a", "b": 10}),
        s("c", "b", "pay", tool="broken", args={"x": 0}),
    )
    second = plan(
        # reworded, same work: its result stands and the card is not charged again
        Step(
            id="pay",
            title="Charge the card",
            instruction="charge it",
            tool="charge",
            args={"amount": 10},
        ),
        s("a", tool="add", args={"a": 5, "b": 5}),  # changed: runs again
        s("b", "a", tool="add", args={"a": "$a", "b": 10}),  # unchanged, but its input changed
        s("c2", "a", "b", "pay", tool="add", args={"a": "$a", "b": "$b"}),
    )
    model = ScriptedModel([plan_response(first), plan_response(second)])
    result = await hierplan.run(
        "the goal",
        model=model,
        strategy="dag",
        tools=[*TOOLS, charge],
        settings=hierplan.RunSettings(retry_backoff_s=0, max_retries=0),
    )
    assert result.status == "succeeded" and result.answer == "30"  # a=10, b=20
    assert charged == [10]
    by_step = [(c.step_id, c.status, c.goal) for c in result.tree.children]
    assert by_step == [
        ("pay", "succeeded", "charge it"),  # the record shows the latest wording
        ("a", "succeeded", "step a"),  # the first a and b ran; version 2 runs them again
        ("b", "succeeded", "step b"),
        ("c", "failed", "step c"),
        ("a", "succeeded", "step a"),
        ("b", "succeeded", "step b"),
        ("c2", "succeeded", "step c2"),
    ]


async def test_when_replanning_fails_the_approved_plan_goes_on_without_it() -> None:
    first = plan(
        s("x", tool="add", args={"a": 1, "b": 1}),
        s("y", "x", tool="broken", args={"x": 0}),
        s("w", "x", tool="slow_add", args={"a": 5, "b": 5}),
        s("v", "w", tool="add", args={"a": "$w", "b": 1}),
        s("after_y", "y", tool="add", args={"a": 1, "b": 1}),
    )
    cyclic = plan(s("p", "q"), s("q", "p"))
    model = ScriptedModel([plan_response(first)] + [plan_response(cyclic)] * 3)
    result = await go(model, "dag", max_retries=0)
    # y failed while w ran; v (after w) was held back for the replan, which never came
    statuses = {c.step_id: c.status for c in result.tree.children}
    assert statuses == {
        "x": "succeeded",
        "y": "failed",
        "w": "succeeded",
        "v": "succeeded",
        "after_y": "cancelled",
    }
    assert result.status == "partial" and result.tree.status == "partial"
    assert result.answer == "11"  # v's, the one end of the plan that was reached
    error = result.tree.error or ""
    assert error.startswith("step 'y' failed: tool 'broken' failed")
    assert "; replanning failed: the planner proposed 3 invalid plans" in error
    assert [v.decision for v in result.tree.plan_versions] == ["approved"] + ["invalid"] * 3


async def test_when_the_replan_strategy_cannot_replan_it_keeps_what_was_done() -> None:
    first = plan(
        s("a", tool="add", args={"a": 1, "b": 1}),
        s("b", "a", tool="add", args={"a": "$a", "b": 10}),
    )
    model = ScriptedModel([plan_response(first), text_response("no plan"), text_response("no")])
    result = await go(model, "replan")
    a, b = result.tree.children
    assert (a.status, b.status) == ("succeeded", "cancelled")
    assert b.error == "not run: replanning failed"
    assert result.status == "partial" and result.tree.output == "2"
    assert (result.tree.error or "").startswith("replanning failed: the model's plan for node 1")


async def test_a_long_goal_reaches_the_model_whole_and_an_overlong_one_is_refused() -> None:
    goal = "Migrate the tables. " * 300 + "FINAL REQUIREMENT: never drop the users table."
    echoed = plan(s("t", tool="add", args={"a": 1, "b": 1}), goal=goal)  # a plan repeats it
    model = ScriptedModel([plan_response(echoed)])
    result = await hierplan.run(goal, model=model, strategy="dag", tools=TOOLS)
    assert result.status == "succeeded"
    model = ScriptedModel([text_response("done")])
    result = await hierplan.run(goal, model=model, strategy="react", tools=TOOLS)
    assert result.status == "succeeded"
    assert "never drop the users table" in model.requests[0].messages[-1].content
    with pytest.raises(hierplan.UserInputError, match="the goal is 100,001 characters long"):
        await hierplan.run("x" * 100_001, model=ScriptedModel([]), strategy="react")


async def test_hierarchical_delegates_subgoals_to_sub_planners() -> None:
    root = plan(s("left", kind="subgoal"), s("right", "left", kind="subgoal"))

    def child(req: ModelRequest) -> Any:
        goal = "step left" if "GOAL: step left" in req.messages[1].content else "step right"
        n = 1 if goal == "step left" else 2
        return plan_response(plan(s("t", tool="add", args={"a": n, "b": n}), goal=goal))

    model = ScriptedModel([plan_response(root), child, child])
    result = await go(model, "hierarchical")
    assert result.status == "succeeded"
    assert [(n.path, n.kind, n.depth) for n in result.nodes()] == [
        ("1", "planner", 1),
        ("1.1", "planner", 2),
        ("1.1.1", "executor", 3),
        ("1.2", "planner", 2),
        ("1.2.1", "executor", 3),
    ]
    assert result.answer == "4"
    assert "DEPTH: 2 of 3" in model.requests[1].messages[1].content
    levels = result.levels()
    assert [row["nodes"] for row in levels] == [1, 2, 2]


async def test_subgoals_beyond_max_depth_go_back_to_the_planner() -> None:
    too_deep = plan(s("sub", kind="subgoal"))
    flat = plan(s("t", tool="add", args={"a": 1, "b": 2}))
    model = ScriptedModel([plan_response(too_deep), plan_response(flat)])
    result = await go(model, "hierarchical", max_depth=1)
    assert result.status == "succeeded"
    first, second = result.tree.plan_versions
    assert first.decision == "invalid" and "depth limit is 1" in first.problems[0]
    assert "Your last plan was invalid" in model.requests[1].messages[1].content
    assert second.reason == "retry" and second.decision == "approved"


async def test_as_needed_decomposes_only_what_fails() -> None:
    model = ScriptedModel(
        [
            text_response("FAILED: too big for one go"),
            plan_response(plan(s("p1"), s("p2", "p1"))),
            tool_response(("add", {"a": 1, "b": 1})),
            text_response("part one is 2"),
            text_response("part two done"),
        ]
    )
    result = await go(model, "as-needed", concurrency=1)
    assert result.status == "succeeded" and result.answer == "part two done"
    assert [(n.path, n.kind, n.status) for n in result.nodes()] == [
        ("1", "planner", "succeeded"),
        ("1.1", "executor", "failed"),
        ("1.2", "planner", "succeeded"),
        ("1.2.1", "executor", "succeeded"),
        ("1.3", "planner", "succeeded"),
        ("1.3.1", "executor", "succeeded"),
    ]
    assert purposes(model) == ["execute", "plan", "execute", "execute", "execute"]


async def test_as_needed_decomposes_down_to_max_depth_as_hierarchical_plans() -> None:
    """max_depth is the deepest plan level for every strategy: at 1, a failed attempt is
    followed by one flat plan, as hierarchical's root plans, whose steps are attempted as tasks
    and not decomposed again."""
    model = ScriptedModel(
        [
            text_response("FAILED: cannot"),
            plan_response(plan(s("a"), s("b", "a"))),
            text_response("A"),
            text_response("B"),
        ]
    )
    result = await go(model, "as-needed", max_depth=1, concurrency=1)
    assert (result.status, result.answer) == ("succeeded", "B")
    assert [(n.path, n.kind, n.status) for n in result.nodes()] == [
        ("1", "planner", "succeeded"),
        ("1.1", "executor", "failed"),
        ("1.2", "executor", "succeeded"),
        ("1.3", "executor", "succeeded"),
    ]
    assert purposes(model) == ["execute", "plan", "execute", "execute"]


async def test_as_needed_nodes_at_max_depth_still_decompose_into_tasks() -> None:
    model = ScriptedModel(
        [
            text_response("FAILED: too big"),  # the root's attempt
            plan_response(plan(s("p"))),  # the root's plan: p is a node at depth 2
            text_response("FAILED: still too big"),  # p's attempt
            plan_response(plan(s("q"))),  # p plans at level 2 = max_depth: q is a task
            text_response("done"),
        ]
    )
    result = await go(model, "as-needed", max_depth=2, concurrency=1)
    assert (result.status, result.answer) == ("succeeded", "done")
    assert [(n.path, n.kind) for n in result.nodes()] == [
        ("1", "planner"),
        ("1.1", "executor"),
        ("1.2", "planner"),
        ("1.2.1", "executor"),
        ("1.2.2", "executor"),
    ]


async def test_usage_is_counted_per_node_and_call_and_tagged_by_phase() -> None:
    model = ScriptedModel(
        [plan_response(plan(s("a"), s("b"))), text_response("A"), text_response("B")],
        priced_as="openai:gpt-5-mini",
    )
    result = await go(model, "dag", concurrency=1)
    root = result.tree
    assert [c.phase for c in root.calls] == ["planning"]
    assert all(c.calls[0].phase == "execution" for c in root.children)
    totals = result.totals()
    assert totals["calls"] == 3
    assert totals["planning_cost_usd"] == pytest.approx(root.cost_usd)
    assert totals["cost_usd"] == pytest.approx(sum(n.cost_usd for n in result.nodes()))
    assert totals["input_tokens"] == sum(
        r.usage.input_tokens for n in result.nodes() for r in n.calls
    )
    assert root.subtree_cost_usd == pytest.approx(totals["cost_usd"])
