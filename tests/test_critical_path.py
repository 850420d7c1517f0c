"""The critical path of a run record and the steps that started while their plan was written
(:mod:`hierplan.view.critical_path`), on records built by hand with known times."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from hierplan.models.base import Phase
from hierplan.plans.plan import Plan, Step
from hierplan.records import CallRecord, NodeRecord, PlanVersion
from hierplan.units import Usage
from hierplan.view.critical_path import (
    Link,
    producing_call,
    run_critical_path,
    started_while_planning,
)


def call(
    start: float, duration: float, purpose: str = "plan", phase: Phase = "planning"
) -> CallRecord:
    return CallRecord(phase, "sim", purpose, Usage(10, 5), 0, start, duration)


def leaf(path: str, step: str, start: float | None, end: float | None) -> NodeRecord:
    return NodeRecord(
        path=path, kind="executor", goal=step, depth=path.count(".") + 1, step_id=step,
        status="succeeded" if end is not None else "pending", started_at=start, finished_at=end,
    )  # fmt: skip


def planner(
    path: str,
    start: float | None,
    end: float | None,
    steps: dict[str, list[str]],
    children: list[NodeRecord],
    calls: list[CallRecord],
    *,
    step: str | None = None,
    created_at: float = 0.0,
) -> NodeRecord:
    """A planner whose one approved plan has ``steps`` (id: the ids it depends on)."""
    plan = Plan(
        goal=path,
        steps=[Step(id=i, title=i, instruction=i, depends_on=d) for i, d in steps.items()],
    )
    node = NodeRecord(
        path=path, kind="planner", goal=path, depth=path.count(".") + 1, step_id=step,
        status="succeeded", started_at=start, finished_at=end, children=children,
        plan_versions=[PlanVersion(1, plan, "initial", created_at, "approved", "auto")],
    )  # fmt: skip
    for item in calls:
        node.add_call(item)
    return node


def links(*items: str | tuple[str, int]) -> tuple[Link, ...]:
    return tuple(Link(i) if isinstance(i, str) else Link(*i) for i in items)


def diamond(b_start: float = 1.1, b_end: float = 5.0) -> NodeRecord:
    """a and b after the plan, c after both: c waits for whichever of a and b ends last."""
    return planner(
        "1", 0.0, 6.1, {"a": [], "b": [], "c": ["a", "b"]},
        [leaf("1.1", "a", 1.1, 3.0), leaf("1.2", "b", b_start, b_end), leaf("1.3", "c", 5.1, 6.0)],
        [call(0.0, 1.0)],
    )  # fmt: skip


def test_the_path_runs_through_the_dependency_that_finished_last() -> None:
    assert run_critical_path(diamond()) == links(("1", 0), "1.2", "1.3", "1")
    # a ends last instead: the path goes through a
    root = diamond(b_end=2.0)
    root.children[2].started_at = 3.1
    assert run_critical_path(root) == links(("1", 0), "1.1", "1.3", "1")


def test_of_two_that_end_together_the_one_that_started_first_is_on_the_path() -> None:
    root = diamond(b_start=1.05, b_end=3.0)
    root.children[2].started_at = 3.1
    assert run_critical_path(root) == links(("1", 0), "1.2", "1.3", "1")
    # the same start and end too: the first in the record
    root.children[1].started_at = 1.1
    assert run_critical_path(root) == links(("1", 0), "1.1", "1.3", "1")


def test_a_node_without_timings_is_never_on_the_path() -> None:
    root = diamond()
    never = root.children[1]
    never.started_at = never.finished_at = None
    # c's other dependency never ran (as if c were started by a later decision): a is the one
    assert run_critical_path(root) == links(("1", 0), "1.1", "1.3", "1")
    root.started_at = None
    assert run_critical_path(root) == ()


def test_a_step_waits_for_its_plan_when_its_dependencies_ended_before_the_plan_did() -> None:
    """c depends on a, which ended long before the replan that added c: the replan call held
    c back, and the replan waited for b, whose failure asked for it."""
    root = planner(
        "1", 0.0, 10.0, {"a": [], "b": [], "c": ["a"]},
        [leaf("1.1", "a", 1.1, 2.0), leaf("1.2", "b", 1.1, 6.0), leaf("1.3", "c", 8.1, 9.9)],
        [call(0.0, 1.0), call(6.1, 1.9, "replan")],
    )  # fmt: skip
    root.children[1].status = "failed"
    assert run_critical_path(root) == links(("1", 0), "1.2", ("1", 1), "1.3", "1")


def test_a_repair_follows_the_call_it_repairs() -> None:
    root = planner(
        "1", 0.0, 4.0, {"a": []}, [leaf("1.1", "a", 2.1, 3.9)],
        [call(0.0, 1.0), call(1.0, 1.0, "plan-repair")],
    )  # fmt: skip
    assert run_critical_path(root) == links(("1", 0), ("1", 1), "1.1", "1")


def test_the_path_goes_into_a_sub_planner_and_on_from_its_dependencies() -> None:
    """1.2 (a planner) depends on 1.1; inside it, its own plan call, then its last leaf."""
    inner = planner(
        "1.2", 3.1, 8.0, {"x": [], "y": []},
        [leaf("1.2.1", "x", 4.1, 5.0), leaf("1.2.2", "y", 4.1, 7.9)],
        [call(3.1, 1.0)], step="b",
    )  # fmt: skip
    root = planner(
        "1", 0.0, 8.1, {"a": [], "b": ["a"]}, [leaf("1.1", "a", 1.1, 3.0), inner],
        [call(0.0, 1.0)],
    )  # fmt: skip
    assert run_critical_path(root) == links(("1", 0), "1.1", ("1.2", 0), "1.2.2", "1.2", "1")


def test_a_step_started_before_its_plan_call_ended_is_streamed() -> None:
    root = planner(
        "1", 0.0, 6.0, {"a": [], "b": ["a"]},
        [leaf("1.1", "a", 0.5, 2.5), leaf("1.2", "b", 2.6, 5.9)],
        [call(0.0, 1.0), call(0.2, 0.1, "execute", "execution")],
    )  # fmt: skip
    a, b = root.children
    assert producing_call(root, a) == 0 and producing_call(root, b) == 0
    assert started_while_planning(root, a)
    assert not started_while_planning(root, b)
    # a could not start before its line of the plan was written: the call is what it waited for
    assert run_critical_path(root) == links(("1", 0), "1.1", "1.2", "1")


def test_the_producing_call_is_the_last_planning_call_started_before_the_step() -> None:
    root = planner(
        "1", 0.0, 9.0, {"a": []}, [leaf("1.1", "a", 5.0, 6.0)],
        # listed out of the order they started in: the latest to start is not the last listed
        [call(0.0, 1.0), call(4.5, 0.1, "replan"), call(4.0, 0.4, "plan"),
         call(7.0, 1.0, "replan")],
    )  # fmt: skip
    assert producing_call(root, root.children[0]) == 1  # the one started at 4.5
    assert not started_while_planning(root, root.children[0])
    executors_only = planner("1", 0.0, 1.0, {"a": []}, [], [call(0, 1, "execute", "execution")])
    assert producing_call(executors_only, root.children[0]) is None
    assert producing_call(root, leaf("1.2", "b", None, None)) is None


def test_a_step_without_a_planning_call_waits_for_what_its_planner_waited_for() -> None:
    """A resumed run's planner had its plan approved before the pause: it made no call."""
    resumed = planner("1.1", 1.1, 3.0, {"x": []}, [leaf("1.1.1", "x", 1.2, 2.9)], [], step="a")
    root = planner("1", 0.0, 3.1, {"a": []}, [resumed], [call(0.0, 1.0)])
    assert run_critical_path(root) == links(("1", 0), "1.1.1", "1.1", "1")


@settings(max_examples=200, deadline=None)
@given(st.lists(st.floats(0, 10, allow_nan=False), min_size=14, max_size=14))
def test_any_times_give_a_path_of_distinct_links_that_exist(times: list[float]) -> None:
    """A run.json may hold any times (a clock set back, a record edited by hand): the walk
    ends, never repeats a link, and names only nodes and planning calls of the record."""
    t = iter(times)
    inner = planner(
        "1.2", next(t), next(t), {"x": [], "y": ["x"]},
        [leaf("1.2.1", "x", next(t), next(t)), leaf("1.2.2", "y", next(t), next(t))],
        [call(next(t), 1.0)], step="b",
    )  # fmt: skip
    root = planner(
        "1", next(t), next(t), {"a": [], "b": ["a"]}, [leaf("1.1", "a", next(t), next(t)), inner],
        [call(next(t), 0.5), call(next(t), 0.5, "replan")],
    )  # fmt: skip
    path = run_critical_path(root)
    assert len(set(path)) == len(path)
    assert path and path[-1] == Link("1")
    for link in path:
        node = root.find(link.path)
        assert node.started_at is not None and node.finished_at is not None
        if link.call is not None:
            assert node.calls[link.call].phase == "planning"


def blocked_then_redone() -> NodeRecord:
    """x blocked twice under the first plan (1.2, then 1.3 run again after a); a streamed
    replan (2.6 to 5.6) redoes it as 1.4, which starts while the replan is still writing."""
    root = planner(
        "1", 0.0, 8.1, {"a": [], "x": []},
        [leaf("1.1", "a", 1.1, 2.0), leaf("1.2", "x", 1.1, 1.5), leaf("1.3", "x", 2.0, 2.5),
         leaf("1.4", "x", 3.0, 8.0)],
        [call(0.0, 1.0), call(2.6, 3.0, "replan")],
    )  # fmt: skip
    for node in root.children[1:3]:
        node.status = "failed"
        node.flags.append("blocked")
    redone = Plan(goal="1", steps=[Step(id=i, title=i, instruction=i) for i in ("a", "x")])
    root.plan_versions.append(PlanVersion(2, redone, "replan", 2.7, "approved", "stream"))
    return root


def test_a_step_run_again_after_it_was_blocked_waited_for_the_rest_of_its_plan() -> None:
    # 1.3 ran again when the rest of the plan had ended (a, at 2.0): not after its own plan
    # call, which ended at 1.0.
    assert run_critical_path(blocked_then_redone())[:3] == links(("1", 0), "1.1", "1.3")


def test_a_step_a_replan_redoes_after_it_was_blocked_waited_for_the_replan() -> None:
    # The blocked runs were under the first plan: 1.4 is the replan's, and waited for it.
    assert run_critical_path(blocked_then_redone())[-3:] == links(("1", 1), "1.4", "1")
