"""Plans: steps that form a DAG inside a plan; sub-goal steps form the tree of plans.

A :class:`Step` is a ``task`` (done by an executor, optionally naming a tool and its arguments) or
a ``subgoal`` (handed to a sub-planner, which makes a child plan). :func:`validate_plan` checks a
plan with networkx and reports every problem at once.

>>> plan = Plan(goal="g", steps=[Step(id="a", title="A", instruction="do a"),
...                              Step(id="b", title="B", instruction="do b", depends_on=["a"])])
>>> validate_plan(plan)
[]
>>> topological_order(plan)
['a', 'b']
"""

from __future__ import annotations

import math
import re
from collections import Counter, deque
from collections.abc import Container, Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from hierplan.errors import UserInputError, field_problems
from hierplan.files import (
    parse_yaml_or_json,
    read_text_file,
)
from hierplan.plans.problems import MAX_PROBLEMS as MAX_PROBLEMS
from hierplan.plans.problems import PlanProblem as PlanProblem
from hierplan.plans.problems import ProblemList, chain_text, names_text, quoted

if TYPE_CHECKING:
    import networkx as nx

DEFAULT_MAX_STEPS = 50
DEFAULT_MAX_DEPTH = 3
STEP_ID_PATTERN = r"^[A-Za-z0-9_][A-Za-z0-9_.\-]{0,63}$"
# The longest goal a run takes: a plan repeats its node's goal, and a step's instruction is a
# sub-goal (or, for react and as-needed, the run's goal itself).
MAX_GOAL_CHARS = 100_000

StepKind = Literal["task", "subgoal"]
# A ``$id`` in a tool argument: the result of step ``id``, filled in by the executor.
REF_PATTERN = re.compile(r"\$([A-Za-z0-9_][A-Za-z0-9_.\-]{0,63})")


def ref_target(token: str, ids: Container[str]) -> str | None:
    """The step id that ``$token`` (a :data:`REF_PATTERN` match) refers to, or ``None``.

    Only a step id of the plan is a reference: ``$100`` in "the total is $100" is text. A
    trailing ``.`` or ``-`` may be punctuation after the reference ("see $draft."), so it is
    dropped when the token with it is not an id.
    """
    while token:
        if token in ids:
            return token
        if token[-1] not in ".-":
            return None
        token = token[:-1]
    return None


class Step(BaseModel):
    """One step of a plan.

    ``depends_on`` names steps of the same plan that must finish first. A ``task`` may name a
    ``tool`` and its ``args``: with both, the step runs the tool directly (no model call, unless
    the tool refuses the call and it is decided again); with a tool but no args, an executor
    model chooses the args. A ``subgoal`` goes to a sub-planner.
    ``estimate_usd`` and ``estimate_tokens`` are the planner's guess of what a sub-goal will cost,
    used by weighted budget allocation.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    id: str = Field(pattern=STEP_ID_PATTERN, description="Unique id of the step in this plan.")
    title: str = Field(min_length=1, max_length=200, description="Short title.")
    instruction: str = Field(
        min_length=1,
        max_length=MAX_GOAL_CHARS,
        description="What to do, for an executor or sub-planner.",
    )
    depends_on: list[str] = Field(
        default_factory=list, description="Ids of steps of this plan that must finish first."
    )
    kind: StepKind = Field(default="task", description="'task' for an executor, 'subgoal' to plan.")
    tool: str | None = Field(default=None, description="Tool to call for a task, if any.")
    args: dict[str, Any] | None = Field(
        default=None, description="Arguments for the tool; omit to let the executor choose."
    )
    tools: list[str] | None = Field(
        default=None,
        description="Restrict this step's executor or sub-planner to these tools.",
    )
    # Bounded like a run's budget: a model that loops on digits writes numbers that no budget
    # arithmetic can take (inf, or an integer too large for a float).
    estimate_usd: float | None = Field(
        default=None,
        ge=0,
        le=1e9,
        allow_inf_nan=False,  # else NaN is refused as "should be <= 1e9", which misleads
        description="Expected cost of a subgoal in USD (for budgets).",
    )
    estimate_tokens: int | None = Field(
        default=None, ge=0, le=10**15, description="Expected tokens of a subgoal (for budgets)."
    )

    def same_work(self, other: Step) -> bool:
        """Whether ``other`` does what this step does, so that this step's result stands for
        it: the same id, kind, tool, arguments, dependencies and tool restriction, and the same
        instruction unless the step calls its tool directly (then the instruction is not used).
        A new title or estimate changes nothing that runs."""
        direct = self.tool is not None and self.args is not None
        return (
            self.id == other.id
            and self.kind == other.kind
            and self.tool == other.tool
            and self.args == other.args
            and set(self.depends_on) == set(other.depends_on)
            and (self.tools is None) == (other.tools is None)
            and set(self.tools or ()) == set(other.tools or ())
            and (direct or self.instruction == other.instruction)
        )


class Plan(BaseModel):
    """A structured plan: a goal and the steps that reach it."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    goal: str = Field(
        min_length=1, max_length=MAX_GOAL_CHARS, description="The goal this plan reaches."
    )
    steps: list[Step] = Field(description="The steps; together they form a DAG.")
    rationale: str = Field(default="", max_length=4000, description="Why this plan.")
    left_out: str = Field(
        default="",
        max_length=2000,
        description=(
            "What of the goal this plan does not do, and why (a budget that cannot pay for all "
            "of it); empty when the plan reaches the whole goal."
        ),
    )

    def step(self, step_id: str) -> Step:
        """The step with id ``step_id``."""
        for s in self.steps:
            if s.id == step_id:
                return s
        raise KeyError(step_id)

    def step_map(self) -> dict[str, Step]:
        """Steps by id (the first one wins if ids repeat; validation reports repeats)."""
        out: dict[str, Step] = {}
        for s in self.steps:
            out.setdefault(s.id, s)
        return out

    def graph(self) -> nx.DiGraph[str]:
        """The dependency graph: an edge ``a -> b`` means b depends on a."""
        import networkx as nx  # here, not on import: importing networkx alone takes ~0.1 s

        g: nx.DiGraph[str] = nx.DiGraph()
        for s in self.steps:
            g.add_node(s.id)
        for s in self.steps:
            for dep in s.depends_on:
                if dep in g:
                    g.add_edge(dep, s.id)
        return g

    def sinks(self) -> list[str]:
        """Ids of steps that no other step depends on, in plan order."""
        needed = {d for s in self.steps for d in s.depends_on}
        return [s.id for s in self.steps if s.id not in needed]


def validate_plan(
    plan: Plan,
    *,
    tools: Iterable[str] | None = None,
    max_steps: int = DEFAULT_MAX_STEPS,
    depth: int = 1,
    max_depth: int = DEFAULT_MAX_DEPTH,
    max_problems: int = MAX_PROBLEMS,
) -> list[PlanProblem]:
    """Every problem of ``plan``, in a stable order; an empty list means valid.

    Checks: empty plan, too many steps, duplicate ids, dangling and self dependencies, cycles,
    ``$id`` references in a direct tool call's arguments to steps it does not depend on,
    tools that are unknown or not allowed (``tools`` is the allowlist; ``None`` skips the
    check), arguments without a tool or that are inf or nan, blank instructions (unless the
    step calls its tool directly), and sub-goals at or beyond ``max_depth`` (a node at ``depth``
    may only plan sub-goals if its children would be at most ``max_depth`` deep).

    The work is linear in the plan's size (its steps, dependencies and arguments). At most
    ``max_problems`` problems are listed; when there are more, a last one (code
    ``more_problems``) says how many.
    """
    found = ProblemList(max_problems)
    if not plan.steps:
        found.add(PlanProblem("empty", "the plan has no steps"))
    if len(plan.steps) > max_steps:
        found.add(
            PlanProblem(
                "too_many_steps",
                f"the plan has {len(plan.steps):,} steps; the limit is {max_steps:,}",
            )
        )
    counts = Counter(s.id for s in plan.steps)
    for step_id, n in counts.items():
        if n > 1:
            found.add(
                PlanProblem("duplicate_id", f"step id {step_id!r} is used {n} times", step_id)
            )
    allowed = None if tools is None else frozenset(tools)
    known = "" if allowed is None else names_text(sorted(allowed)) or "none"
    limits = _Limits(allowed, known, depth, max_depth)
    for s in plan.steps:
        _dependency_problems(s, counts, found)
        found.extend(_step_problems(s, counts, limits))
    found.extend(_cycle_problems(plan))
    return found.listed()


def _dependency_problems(s: Step, ids: Container[str], found: ProblemList) -> None:
    """Self and dangling dependencies of ``s``, each named once however often it is listed.

    A ``depends_on`` may hold millions of entries: once the problems listed are full, the
    rest are only counted.
    """
    for dep in dict.fromkeys(s.depends_on):
        if dep != s.id and dep in ids:
            continue
        if found.full:
            found.more += 1
        elif dep == s.id:
            found.add(PlanProblem("self_dependency", f"step {s.id!r} depends on itself", s.id))
        else:
            found.add(
                PlanProblem(
                    "dangling_dependency",
                    f"step {s.id!r} depends on {quoted(dep)}, which is not a step of this plan",
                    s.id,
                )
            )


@dataclass(slots=True, frozen=True)
class _Limits:
    """What a plan's steps are checked against: the tools allowed (``None``: any, unchecked)
    and their names as a message lists them, the plan's depth and the deepest allowed."""

    allowed: frozenset[str] | None
    known: str
    depth: int
    max_depth: int


def _step_problems(s: Step, ids: Container[str], limits: _Limits) -> Iterator[PlanProblem]:
    """The problems of one step but its dependencies (:func:`_dependency_problems`)."""
    yield from _reference_problems(s, ids)
    if s.tool is not None or s.tools is not None or s.args is not None:  # most steps: no call
        yield from _tool_problems(s, limits.allowed, limits.known)
    if s.args is not None and _has_non_finite(s.args):
        # JSON has no inf or nan: the plan's record, events and YAML would say null instead.
        yield PlanProblem(
            "non_finite_arg",
            f"step {s.id!r} has an argument that is inf or nan: give a finite number",
            s.id,
        )
    if not s.instruction.strip() and not (s.tool is not None and s.args is not None):
        # Whitespace passes the schema's min_length, but an executor or sub-planner given it has
        # nothing to do; a step that calls its tool directly does not use its instruction.
        yield PlanProblem(
            "blank_instruction",
            f"step {s.id!r} has a blank instruction: say what the step does",
            s.id,
        )
    if s.kind == "subgoal":
        if s.tool is not None:
            yield PlanProblem("subgoal_with_tool", f"sub-goal {s.id!r} cannot name a tool", s.id)
        if limits.depth >= limits.max_depth:
            yield PlanProblem(
                "too_deep",
                f"step {s.id!r} is a sub-goal, but this plan is at depth {limits.depth} and the "
                f"depth limit is {limits.max_depth}: make it a task",
                s.id,
            )


def _tool_problems(s: Step, allowed: frozenset[str] | None, known: str) -> Iterator[PlanProblem]:
    """The step's tool, tool list and args against the tools allowed here (``known`` names
    them) and each other."""
    if s.tool is not None and allowed is not None and s.tool not in allowed:
        yield PlanProblem(
            "unknown_tool",
            f"step {s.id!r} uses tool {quoted(s.tool)}, which is unknown or not allowed here "
            f"(allowed: {known})",
            s.id,
        )
    if s.tools is not None and allowed is not None:
        for name in dict.fromkeys(s.tools):
            if name not in allowed:
                yield PlanProblem(
                    "unknown_tool",
                    f"step {s.id!r} allows tool {quoted(name)}, which is unknown or not "
                    "allowed here",
                    s.id,
                )
    if s.tool is not None and s.tools is not None and s.tool not in s.tools:
        yield PlanProblem(
            "tool_not_in_tools",
            f"step {s.id!r} uses tool {quoted(s.tool)} but its tools list leaves it out: add "
            "it to tools, or drop tools",
            s.id,
        )
    if s.args is not None and s.tool is None:
        yield PlanProblem("args_without_tool", f"step {s.id!r} has args but no tool", s.id)


def _has_non_finite(value: Any) -> bool:
    """Whether ``value`` (JSON-like) holds an inf or nan float, at any depth: without recursion,
    as a plan's arguments may nest as deep as a JSON reader allows."""
    pending = [value]
    while pending:
        item = pending.pop()
        if isinstance(item, float):
            if not math.isfinite(item):
                return True
        elif isinstance(item, dict):
            pending.extend(item.values())
        elif isinstance(item, list):
            pending.extend(item)
    return False


def step_refs(step: Step, ids: Container[str]) -> set[str]:
    """Step ids (of ``ids``, the plan's) referenced as ``$id`` in a step's string arguments,
    including the strings inside list and object arguments (which the executor resolves too)."""
    refs: set[str] = set()
    pending: list[Any] = list((step.args or {}).values())
    while pending:
        value = pending.pop()
        if isinstance(value, str):
            if "$" in value:
                for token in REF_PATTERN.findall(value):
                    target = ref_target(token, ids)
                    if target is not None:
                        refs.add(target)
        elif isinstance(value, list):
            pending.extend(value)
        elif isinstance(value, dict):
            pending.extend(value.values())
    return refs


def _reference_problems(s: Step, ids: Container[str]) -> list[PlanProblem]:
    """``$id`` references in a direct tool call's arguments to steps it does not depend on.

    The executor fills a reference in from the result of a dependency: any other step may not
    have run yet when this one starts, so its result would not be there.
    """
    if s.tool is None or s.args is None:
        return []  # no direct call: nothing fills references in
    out: list[PlanProblem] = []
    for ref in sorted(step_refs(s, ids) - set(s.depends_on)):
        if ref == s.id:
            # "depend on it" would be a self-dependency, which is refused too
            message = (
                f"step {s.id!r} uses ${ref}, its own result, which does not exist before it "
                "runs: refer to a step it depends on"
            )
        else:
            message = f"step {s.id!r} uses ${ref} but does not depend on {ref!r}"
        out.append(PlanProblem("bad_reference", message, s.id))
    return out


def _acyclic(plan: Plan) -> bool:
    """Whether the dependencies between distinct steps form no cycle (Kahn's algorithm).

    The common case, checked for every plan the gate sees, without the networkx graph that
    naming a cycle needs: building it costs several milliseconds for a plan of a few hundred
    steps, time the run waits before its first step starts.
    """
    ids = {s.id for s in plan.steps}
    edges = {(d, s.id) for s in plan.steps for d in s.depends_on if d != s.id and d in ids}
    waiting = dict.fromkeys(ids, 0)
    dependents: dict[str, list[str]] = {i: [] for i in ids}
    for dep, step_id in edges:
        waiting[step_id] += 1
        dependents[dep].append(step_id)
    free = [i for i, n in waiting.items() if n == 0]
    seen = 0
    while free:
        seen += 1
        for step_id in dependents[free.pop()]:
            waiting[step_id] -= 1
            if waiting[step_id] == 0:
                free.append(step_id)
    return seen == len(ids)


def _cycle_problems(plan: Plan) -> list[PlanProblem]:
    if _acyclic(plan):
        return []
    import networkx as nx  # only a plan with a cycle needs it, to name the cycle

    graph = plan.graph()
    graph.remove_edges_from(list(nx.selfloop_edges(graph)))  # reported as self_dependency
    order = {s.id: i for i, s in enumerate(plan.steps)}
    out: list[PlanProblem] = []
    for component in nx.strongly_connected_components(graph):
        if len(component) > 1:
            start = min(component, key=order.__getitem__)
            path = _shortest_cycle(graph, start, component, order)
            # Arrows as in Plan.graph: "x -> y" means y depends on x.
            message = f"dependency cycle among steps: {chain_text(path)}"
            # One cycle is named, but every step of the component is on some cycle: name the
            # others too, so that breaking the one named is not taken for the whole fix.
            others = sorted(component - set(path), key=order.__getitem__)
            if others:
                verb = "is" if len(others) == 1 else "are"
                message += f" ({names_text(others)} {verb} in a cycle with them too)"
            out.append(PlanProblem("cycle", message, start))
    return sorted(out, key=lambda p: p.message)


def _shortest_cycle(
    graph: nx.DiGraph[str], start: str, component: set[str], order: Mapping[str, int]
) -> list[str]:
    """The shortest cycle from ``start`` back to it inside ``component`` (a strongly connected
    component of ``graph`` holding ``start``), as step ids beginning and ending with ``start``;
    ties go to the steps first in plan order, so the same plan always names the same cycle."""
    parent: dict[str, str] = {}
    queue: deque[str] = deque([start])
    while queue:
        node = queue.popleft()
        for nxt in sorted(graph.successors(node), key=order.__getitem__):
            if nxt == start:
                path = [node]
                while path[-1] != start:
                    path.append(parent[path[-1]])
                return [*reversed(path), start]
            if nxt in component and nxt not in parent:
                parent[nxt] = node
                queue.append(nxt)
    # Every step of a strongly connected component reaches every other one.
    raise AssertionError(f"no cycle through {start!r} in its strongly connected component")


def topological_order(plan: Plan) -> list[str]:
    """Step ids so that every step comes after its dependencies; ties keep plan order.

    Raises ``ValueError`` if the plan has a cycle (validate it first).
    """
    import networkx as nx  # here, not on import, as in Plan.graph

    order = {s.id: i for i, s in enumerate(plan.steps)}
    try:
        return list(nx.lexicographical_topological_sort(plan.graph(), key=order.__getitem__))
    except nx.NetworkXUnfeasible as exc:
        raise ValueError("the plan has a dependency cycle") from exc


def critical_path(
    plan: Plan, durations: Mapping[str, float] | None = None
) -> tuple[float, list[str]]:
    """The longest dependency chain, weighted by step durations (default 1 per step).

    Returns the chain's total duration and its step ids in order. This is the lower bound on a
    plan's makespan with unlimited concurrency.
    """
    weights = durations or {}
    best: dict[str, tuple[float, str | None]] = {}
    graph = plan.graph()
    for node in topological_order(plan):
        own = float(weights.get(node, 1.0))
        preds = list(graph.predecessors(node))
        if preds:
            prev = max(preds, key=lambda p: best[p][0])
            best[node] = (best[prev][0] + own, prev)
        else:
            best[node] = (own, None)
    if not best:
        return 0.0, []
    end = max(best, key=lambda n: best[n][0])
    chain: list[str] = []
    cursor: str | None = end
    while cursor is not None:
        chain.append(cursor)
        cursor = best[cursor][1]
    return best[end][0], chain[::-1]


def plan_from_data(data: Any, *, source: str = "plan") -> Plan:
    """Validate parsed data as a :class:`Plan`; errors name each bad field."""
    try:
        return Plan.model_validate(data)
    except ValidationError as exc:
        raise UserInputError(
            f"{source} is not a valid plan: {field_problems(exc, 'plan')}"
        ) from None


def load_plan(path: Path) -> Plan:
    """Read a plan from a YAML or JSON file, with a clear error for anything wrong."""
    text = read_text_file(path, "plan file")
    data = parse_yaml_or_json(text, path, "plan file")
    if isinstance(data, dict) and {"run_id", "tree"} <= data.keys():
        # A run.json given for a plan: say so, not list its twenty fields a plan lacks.
        raise UserInputError(
            f"plan file {path} is a run record, not a plan: give a file with a plan's 'goal' "
            f"and 'steps' (hierplan view {path} shows the run)"
        )
    return plan_from_data(data, source=f"plan file {path}")


# Characters YAML reads as line breaks: PyYAML writes them as they are in plain and
# single-quoted scalars, where reading folds them into a space, so "a\x85b" came back "a b".
_YAML_BREAKS = frozenset("\x85\u2028\u2029")


class _PlanDumper(yaml.SafeDumper):
    """``yaml.SafeDumper`` that double-quotes (and so escapes) strings holding a YAML break."""


def _represent_str(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
    style = '"' if _YAML_BREAKS.intersection(value) else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_PlanDumper.add_representer(str, _represent_str)


def plan_to_yaml(plan: Plan) -> str:
    """A plan as YAML, without unset optional fields, for people to read and edit; reading it
    back gives the same plan."""
    data = plan.model_dump(mode="json", exclude_none=True, exclude_defaults=True)
    data.setdefault("steps", [])
    return yaml.dump(data, Dumper=_PlanDumper, sort_keys=False, allow_unicode=True, width=100)


@dataclass(slots=True, frozen=True)
class PlanDiff:
    """What changed between two plan versions, by step id."""

    added: tuple[str, ...] = ()
    removed: tuple[str, ...] = ()
    changed: tuple[str, ...] = ()

    @property
    def empty(self) -> bool:
        """True when the two versions have the same steps."""
        return not (self.added or self.removed or self.changed)

    def summary(self) -> str:
        """One line, e.g. ``+1 -0 ~2 (added: c; changed: a, b)``."""
        head = f"+{len(self.added)} -{len(self.removed)} ~{len(self.changed)}"
        parts = [
            f"{label}: {', '.join(ids)}"
            for label, ids in (
                ("added", self.added),
                ("removed", self.removed),
                ("changed", self.changed),
            )
            if ids
        ]
        return f"{head} ({'; '.join(parts)})" if parts else f"{head} (no change)"


def diff_plans(old: Plan, new: Plan) -> PlanDiff:
    """Steps added, removed and changed (same id, different content) from ``old`` to ``new``."""
    before = old.step_map()
    after = new.step_map()
    return PlanDiff(
        added=tuple(i for i in after if i not in before),
        removed=tuple(i for i in before if i not in after),
        changed=tuple(i for i in after if i in before and before[i] != after[i]),
    )
