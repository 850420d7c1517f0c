"""Checks that a run's events are complete and in causal order, against its run record."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence

import pytest

from hierplan.core.events import (
    BudgetReserved,
    BudgetSettled,
    ModelCalled,
    NodeFinished,
    NodeStarted,
    PlanDecided,
    PlanProposed,
    RunEvent,
    RunFinished,
    RunStarted,
    parse_event,
)
from hierplan.records import RunResult


def parent_of(path: str) -> str | None:
    """``1.2`` for ``1.2.3``; ``None`` for the root."""
    return path.rsplit(".", 1)[0] if "." in path else None


def check_events(events: Sequence[RunEvent], result: RunResult) -> None:
    """Every check of completeness and order that holds for any run (see the test names)."""
    assert isinstance(events[0], RunStarted)
    assert isinstance(events[-1], RunFinished)
    assert sum(isinstance(e, RunStarted | RunFinished) for e in events) == 2
    assert {e.run_id for e in events} == {result.run_id}
    starts: dict[str, int] = {}
    finishes: dict[str, int] = {}
    for i, event in enumerate(events):
        if isinstance(event, NodeStarted):
            assert event.path not in starts, f"node {event.path} started twice"
            starts[event.path] = i
        elif isinstance(event, NodeFinished):
            assert event.path in starts, f"node {event.path} finished before it started"
            assert event.path not in finishes, f"node {event.path} finished twice"
            finishes[event.path] = i
    # every node that ran has a start and a finish, and nothing else has either
    ran = {n.path for n in result.nodes() if n.started_at is not None}
    assert set(starts) == ran == set(finishes)
    records = {n.path: n for n in result.nodes()}
    for path, i in starts.items():
        assert i < finishes[path]
        parent = parent_of(path)
        if parent is not None:
            assert starts[parent] < i < finishes[path] < finishes[parent]
        finished = events[finishes[path]]
        assert isinstance(finished, NodeFinished)
        assert finished.status == records[path].status
        assert finished.cost_usd == pytest.approx(records[path].cost_usd)
    # node events happen while their node runs; plans are decided after they are proposed
    proposed: dict[tuple[str, int], int] = {}
    approved_at: dict[str, list[int]] = defaultdict(list)
    for i, event in enumerate(events):
        if isinstance(event, RunStarted | RunFinished | NodeStarted | NodeFinished):
            continue
        assert starts[event.path] < i < finishes[event.path], event
        if isinstance(event, PlanProposed):
            proposed[(event.path, event.version)] = i
        elif isinstance(event, PlanDecided):
            assert proposed[(event.path, event.version)] < i
            if event.decision == "approved":
                approved_at[event.path].append(i)
    for path, i in starts.items():
        parent = parent_of(path)
        if parent is not None and records[parent].plan_versions:
            assert approved_at[parent] and approved_at[parent][0] < i, path
    check_costs(events, result)
    for event in events:
        assert parse_event(event.model_dump_json()) == event


def check_costs(events: Sequence[RunEvent], result: RunResult) -> None:
    """Model-call events add up to the run's totals, and to what the run finished with."""
    totals = result.totals()
    calls = [e for e in events if isinstance(e, ModelCalled)]
    assert len(calls) == totals["calls"]
    assert sum(c.cost_usd or 0.0 for c in calls) == pytest.approx(totals["cost_usd"])
    assert sum(c.input_tokens for c in calls) == totals["input_tokens"]
    assert sum(c.output_tokens for c in calls) == totals["output_tokens"]
    finished = events[-1]
    assert isinstance(finished, RunFinished)
    assert finished.cost_usd == pytest.approx(totals["cost_usd"])
    assert finished.status == result.status
    roots = [e for e in events if isinstance(e, NodeFinished) and e.path == "1"]
    if roots:
        assert roots[0].subtree_cost_usd == pytest.approx(totals["cost_usd"])
    settled = [e for e in events if isinstance(e, BudgetSettled)]
    reserved = [e for e in events if isinstance(e, BudgetReserved)]
    assert len(settled) == len(reserved)  # every reservation is settled or released
    if settled:
        assert sum(e.usd or 0.0 for e in settled) == pytest.approx(totals["cost_usd"])
        assert sum(e.tokens for e in settled) == totals["input_tokens"] + totals["output_tokens"]
