"""What made a run take as long as it did, read from its record: the critical path, and the steps
that started while their plan was still being written.

The critical path is the chain of nodes and planning calls that ends last. It is found by walking
back from the end of the run. A node that holds work (a planner's children and its own model
calls) ended when the last of that work ended, so the walk goes into that work. A node that holds
none (a leaf) was held back until it started by what it waited for: of its dependencies (the
steps its parent's approved plan lists in ``depends_on``) and the planning call of its parent
that produced it, the one that ended last (the call itself for a step that started while the call
was still writing its plan). A step run again after its tool was blocked (the flag ``blocked``
on an earlier node of the same step, under the same planning call) waited instead for the rest of
its plan: what ended last of its siblings before it started. A planning call waited for what ended
last in its node before it started (an earlier call that a repair follows, the children of a plan
that a replan follows), or else for what the node itself waited for.

Everything here is pure: it reads a :class:`~hierplan.records.NodeRecord` tree and returns
paths and call indices. Nodes without both timings (never started, or a record cut short) are
left out; a run whose root has none has no critical path.
"""

from __future__ import annotations

from dataclasses import dataclass

from hierplan.plans.plan import Step
from hierplan.records import CallRecord, NodeRecord

TOLERANCE_S = 1e-4
"""How far one time may pass another and still count as before it. A call's end is its start
(the wall clock) plus its duration (a monotonic clock), so the two clocks may disagree by a few
microseconds; in a real run a step starts about a millisecond after its plan's call ends at the
soonest (the gate runs between them), far more than this."""


@dataclass(frozen=True, slots=True)
class Link:
    """One link of the critical path: the node at ``path``, or, when ``call`` is set, that
    node's model call at index ``call`` of its ``calls``."""

    path: str
    call: int | None = None


def call_end(call: CallRecord) -> float:
    """When a model call ended (a Unix time)."""
    return call.started_at + call.duration_s


def producing_call(parent: NodeRecord, child: NodeRecord) -> int | None:
    """The index in ``parent.calls`` of the planning call that produced ``child``'s step: the
    parent's last planning call that started no later than the child did (``None`` when the
    child has no start time or no planning call started before it)."""
    if child.started_at is None:
        return None
    before = [
        index
        for index, call in enumerate(parent.calls)
        if call.phase == "planning" and call.started_at <= child.started_at + TOLERANCE_S
    ]
    # Calls are recorded as they end: the latest to start is not always the last listed.
    return max(before, key=lambda index: parent.calls[index].started_at, default=None)


def started_while_planning(parent: NodeRecord, child: NodeRecord) -> bool:
    """True when ``child`` started before the planning call that produced it ended: its step
    was dispatched while its plan was still being written (streamed)."""
    index = producing_call(parent, child)
    if index is None or child.started_at is None:
        return False
    return child.started_at < call_end(parent.calls[index]) - TOLERANCE_S


def _timed(node: NodeRecord) -> bool:
    return node.started_at is not None and node.finished_at is not None


_Item = tuple[NodeRecord, int | None]
"""A node (``None``) or one of its calls (the call's index), with the times below."""


def _end(item: _Item) -> float:
    node, index = item
    return call_end(node.calls[index]) if index is not None else node.finished_at or 0.0


def _start(item: _Item) -> float:
    node, index = item
    return node.calls[index].started_at if index is not None else node.started_at or 0.0


def _last(items: list[_Item]) -> _Item | None:
    """The item that ended last; on a tie the one that started first (it held the most of
    the time), then the first listed (a node's children before its calls, a step's
    dependencies in the order its plan names them)."""
    best: _Item | None = None
    for item in items:
        if best is None:
            best = item
            continue
        end, best_end = _end(item), _end(best)
        if end > best_end or (end == best_end and _start(item) < _start(best)):
            best = item
    return best


def _inside(node: NodeRecord, before: float | None = None) -> list[_Item]:
    """A node's timed children and own model calls, those that ended by ``before`` if given.
    A leaf's own calls are not its inner work: the leaf is one link."""
    items: list[_Item] = [(child, None) for child in node.children if _timed(child)]
    if node.children or node.kind == "planner":
        items += [(node, i) for i, call in enumerate(node.calls) if call.phase == "planning"]
    if before is not None:
        items = [item for item in items if _end(item) <= before + TOLERANCE_S]
    return items


class _Walk:
    """One walk back from the end of a run (the parents of each node, the links found)."""

    def __init__(self, root: NodeRecord) -> None:
        self.parents: dict[int, NodeRecord] = {}
        for node in root.walk():
            for child in node.children:
                self.parents[id(child)] = node
        self.links: list[Link] = []
        self.seen: set[Link] = set()
        # Per planner, once: its approved plans' steps and its children by step. A chain of
        # thousands of steps looks these up at every link.
        self.plans: dict[int, list[tuple[float, dict[str, Step]]]] = {}
        self.by_step: dict[int, dict[str, list[NodeRecord]]] = {}

    def add(self, link: Link) -> bool:
        """Record ``link``; false if it was found before (a record whose times loop)."""
        if link in self.seen:
            return False
        self.seen.add(link)
        self.links.append(link)
        return True

    def run(self, item: _Item | None) -> None:
        while item is not None:
            node, index = item
            if not self.add(Link(node.path, index)):
                return
            if index is None:
                inner = _last(_inside(node))
                item = inner if inner is not None else self.waited_for(node)
            else:
                earlier = _last(_inside(node, node.calls[index].started_at))
                item = earlier if earlier is not None else self.waited_for(node)

    def dependencies(self, parent: NodeRecord, child: NodeRecord) -> list[NodeRecord]:
        """The timed siblings that ``child``'s step depends on, in the plan the parent had
        approved when the child started (the latest approved version with that step, if none
        was yet), that finished before the child started (a sibling of a later replan is no
        dependency)."""
        if child.step_id is None or child.started_at is None:
            return []
        key = id(parent)
        if key not in self.plans:
            self.plans[key] = [
                (v.created_at, v.plan.step_map())
                for v in parent.plan_versions
                if v.decision == "approved"
            ]
            by_step: dict[str, list[NodeRecord]] = {}
            for sibling in parent.children:
                if sibling.step_id is not None and _timed(sibling):
                    by_step.setdefault(sibling.step_id, []).append(sibling)
            self.by_step[key] = by_step
        with_step = [steps for _, steps in self.plans[key] if child.step_id in steps]
        if not with_step:
            return []
        earlier = [
            steps
            for created, steps in self.plans[key]
            if child.step_id in steps and created <= child.started_at
        ]
        step = (earlier or with_step)[-1][child.step_id]
        start = child.started_at
        index = producing_call(parent, child)
        made = parent.calls[index].started_at if index is not None else 0.0
        if any(
            "blocked" in run.flags
            and (run.started_at or 0.0) >= made
            and (run.finished_at or 0.0) <= start + TOLERANCE_S
            for run in self.by_step[key].get(child.step_id, ())
        ):
            # A blocked step run again (by the plan of the same planning call: not a step a
            # replan redoes) waited for the rest of its plan, not its dependencies.
            ended = _inside(parent, start)
            return [sibling for sibling, call in ended if call is None and sibling is not child]
        return [
            sibling
            for wanted in dict.fromkeys(step.depends_on)
            for sibling in self.by_step[key].get(wanted, [])
            if sibling is not child and (sibling.finished_at or 0.0) <= start + TOLERANCE_S
        ]

    def waited_for(self, node: NodeRecord) -> _Item | None:
        """What ``node`` waited for before it started: of its dependencies and the planning
        call of its parent that produced it, the one that ended last before it started; the
        producing call if it had not ended (a streamed step); else what its parent waited
        for."""
        parent = self.parents.get(id(node))
        if parent is None:
            return None
        candidates: list[_Item] = [(dep, None) for dep in self.dependencies(parent, node)]
        index = producing_call(parent, node)
        if index is not None:
            produced: _Item = (parent, index)
            if _end(produced) <= (node.started_at or 0.0) + TOLERANCE_S:
                candidates.append(produced)
        found = _last(candidates)
        if found is not None:
            return found
        if index is not None:
            return (parent, index)
        return self.waited_for(parent)


def run_critical_path(root: NodeRecord) -> tuple[Link, ...]:
    """The critical path of the run under ``root`` as it ran, earliest link first: nodes (a
    planner because the path runs through its work, a leaf as a whole) and planning calls.
    (:func:`hierplan.critical_path` is a plan's longest chain before it runs.)

    Empty when ``root`` has no timings."""
    if not _timed(root):
        return ()
    walk = _Walk(root)
    walk.run((root, None))
    return tuple(reversed(walk.links))
