"""A run record built by hand for the report's timeline, with a known critical path and one
step that started while its plan was being written (no run streams steps yet)."""

from __future__ import annotations

from hierplan.models.base import Phase
from hierplan.plans.plan import Plan, Step
from hierplan.records import CallRecord, NodeRecord, PlanVersion, RunResult
from hierplan.units import Usage

T0 = 1_700_000_000.0

CRITICAL_NODES = ["1", "1.2", "1.2.1", "1.2.2", "1.3"]
"""The nodes on the critical path of :func:`timeline_run`."""

CRITICAL_CALLS = [("1", 0), ("1.2", 0)]
"""Its planning calls on the critical path: (node path, index in the node's calls)."""

STREAMED = "1.1"
"""Its step that started before the root's planning call ended."""

TIMED = ["1", "1.1", "1.2", "1.2.1", "1.2.2", "1.3"]
"""Its nodes with timings, by start (1.4 never started)."""


def model_call(
    start: float, duration: float, purpose: str, phase: Phase = "planning"
) -> CallRecord:
    """A model call of ``duration`` seconds from ``start`` seconds after :data:`T0`."""
    return CallRecord(phase, "sim", purpose, Usage(100, 20), 1_000_000, T0 + start, duration)


def _plan(goal: str, steps: dict[str, list[str]]) -> PlanVersion:
    plan = Plan(
        goal=goal,
        steps=[Step(id=i, title=i, instruction=i, depends_on=d) for i, d in steps.items()],
    )
    return PlanVersion(1, plan, "initial", T0, "approved", "auto")


def _node(
    path: str,
    step: str | None,
    span: tuple[float, float] | None,
    children: list[NodeRecord] | None = None,
    plan: PlanVersion | None = None,
) -> NodeRecord:
    return NodeRecord(
        path=path,
        kind="executor" if plan is None else "planner",
        goal=f"goal of {path}",
        depth=path.count(".") + 1,
        step_id=step,
        status="succeeded" if span is not None else "pending",
        started_at=None if span is None else T0 + span[0],
        finished_at=None if span is None else T0 + span[1],
        children=children or [],
        plan_versions=[] if plan is None else [plan],
    )


def timeline_run() -> RunResult:
    """Seconds after T0: the root plans from 0 to 1; step a (1.1) starts at 0.5, before that
    call ends, and ends at 3; step b (1.2) plans 1.2 to 2, then runs x (2.1 to 3.5) and y after
    x (3.6 to 5.9); step c (1.3) waits for a and b and runs 6.1 to 9.9; step d (1.4) never
    started. The path: the root's call, b's call, x, y, b, c, the root."""
    a = _node("1.1", "a", (0.5, 3.0))
    a.add_call(model_call(0.6, 0.2, "execute", "execution"))
    a.add_call(model_call(2.0, 0.5, "execute", "execution"))
    b = _node(
        "1.2", "b", (1.1, 6.0),
        [_node("1.2.1", "x", (2.1, 3.5)), _node("1.2.2", "y", (3.6, 5.9))],
        _plan("b", {"x": [], "y": ["x"]}),
    )  # fmt: skip
    b.add_call(model_call(1.2, 0.8, "plan"))
    root = _node(
        "1", None, (0.0, 10.0),
        [a, b, _node("1.3", "c", (6.1, 9.9)), _node("1.4", "d", None)],
        _plan("root", {"a": [], "b": [], "c": ["a", "b"], "d": ["c"]}),
    )  # fmt: skip
    root.add_call(model_call(0.0, 1.0, "plan"))
    return RunResult(
        run_id="timeline", goal="a run built by hand", strategy="hierarchical", model="sim",
        simulated=True, status="partial", answer="", tree=root, started_at=T0,
        finished_at=T0 + 10.0,
    )  # fmt: skip
