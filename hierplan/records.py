"""The run record: what happened at every node, serialised to ``run.json``.

:class:`NodeRecord` and :class:`CallRecord` are filled in while the run goes (slotted dataclasses,
cheap on the hot path); :class:`RunResult` holds the tree and computes the rollups per level and
per phase when asked. ``RunResult.load`` reads a ``run.json`` back, validated by pydantic.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from decimal import Decimal
from pathlib import Path
from typing import Annotated, Any, Literal

import pydantic_core
from pydantic import BeforeValidator, Field, PlainSerializer, TypeAdapter, ValidationError

from hierplan.errors import UserInputError, first_problem
from hierplan.files import StrPath, make_directory, open_regular_file, write_atomic
from hierplan.models.base import Phase
from hierplan.plans.plan import Plan, PlanDiff
from hierplan.redact import redact
from hierplan.text import encodable, map_strings, replace_strings
from hierplan.units import PICO_PER_USD, Usage

RECORD_FORMAT = 1

KEPT_AS_WRITTEN = frozenset(
    {
        # names that other fields refer to, which must read back as they were written
        *("id", "depends_on", "step_id", "path", "run_id", "tool", "tools"),
        *("added", "removed", "changed"),
        # figures, which hold no free text: the bulk of a large record, skipped quickly
        *("calls", "usage", "levels", "totals"),
    }
)
"""The fields of ``run.json`` written as they are, never redacted: names that other fields
refer to (step ids, node paths, tool names), so that the record reads back whole, and the
figures of calls and rollups."""


def _pico_from_usd(value: Any) -> Any:
    """A USD figure of ``run.json`` as the whole pico-dollars it was written from (a float of
    ``pico / 10**12`` gives its integer back exactly); anything else is left to validation."""
    if isinstance(value, float | int) and not isinstance(value, bool):
        return round(Decimal(repr(float(value))) * PICO_PER_USD)
    return value


Pico = Annotated[
    int,
    BeforeValidator(_pico_from_usd),
    PlainSerializer(lambda pico: pico / PICO_PER_USD, return_type=float),
]
"""Money in a record: whole pico-dollars in memory, USD in ``run.json``."""

NodeKind = Literal["planner", "executor"]
NodeStatus = Literal[
    "pending",
    "running",
    "succeeded",
    "partial",
    "failed",
    "cancelled",
    "rejected",
    "budget_exhausted",
    "paused",
    "skipped",
]
RunStatus = Literal["succeeded", "partial", "failed", "rejected", "cancelled", "paused", "skipped"]
FINISHED_OK: frozenset[str] = frozenset({"succeeded"})


@dataclass(slots=True)
class CallRecord:
    """One model call (one attempt): usage, cost, timing, phase and flags.

    ``cost_pico`` (``cost_usd`` in ``run.json``) is ``None`` when the model has no known price.
    Flags name anything unusual:
    ``no_usage`` (counted at the request's worst case), ``overrun``, ``invalid_usage`` (usage
    reported with negative counts or more cache reads and writes than input, counted as the
    nearest possible usage), ``failed``, ``cut_short`` (cancelled or past a deadline before the
    reply came, counted at the request's worst case: the provider may have billed it; ``ok``
    is false).
    """

    phase: Phase
    model: str
    purpose: str
    usage: Usage
    cost_pico: Annotated[Pico | None, Field(alias="cost_usd")]
    started_at: float
    duration_s: float
    attempt: int = 1
    ok: bool = True
    flags: list[str] = field(default_factory=list)

    @property
    def cost_usd(self) -> float | None:
        """The call's cost in USD (``None`` without a known price)."""
        return None if self.cost_pico is None else self.cost_pico / PICO_PER_USD


@dataclass(slots=True)
class ToolCallRecord:
    """One tool call of a node: the tool, its arguments and its result as text clipped to
    :data:`TOOL_TEXT_LIMIT` characters, the error it failed with (``None`` when it succeeded),
    when it started (a Unix time) and how long it took."""

    tool: str
    arguments: str
    result: str | None
    error: str | None
    started_at: float
    duration_s: float


# Enough of a tool call's arguments and result to see what it did; a record of thousands of
# calls must not hold every page a tool fetched.
TOOL_TEXT_LIMIT = 300


@dataclass(slots=True)
class DecisionRecord:
    """One decision on a plan version, for the audit trail: what, who or what decided, when.

    ``decision`` is ``approved``, ``edited``, ``rejected``, ``invalid`` or ``pending`` (the run
    paused for a decision from outside); ``problems`` are the validators' findings.
    """

    decision: str
    by: str
    at: float
    note: str = ""
    problems: list[str] = field(default_factory=list)


@dataclass(slots=True)
class PlanVersion:
    """One version of a node's plan and how it came about.

    ``reason`` is ``initial``, ``repair``, ``replan``, ``edit`` or ``retry`` (a new plan after a
    rejection or invalid plan). ``decision`` is the gate's latest: ``approved``, ``edited``,
    ``rejected``, ``invalid`` or ``pending``; ``decided_by`` names who or what decided.
    ``history`` keeps every decision in order (a paused plan is ``pending``, then decided).
    """

    version: int
    plan: Plan
    reason: str
    created_at: float
    decision: str | None = None
    decided_by: str | None = None
    decided_at: float | None = None
    note: str = ""
    problems: list[str] = field(default_factory=list)
    diff: PlanDiff | None = None
    history: list[DecisionRecord] = field(default_factory=list)


_NO_USAGE = Usage()


@dataclass(slots=True)
class NodeRecord:
    """One node of the run tree: a planner (it planned) or an executor (it did a step).

    ``path`` names it (``1`` is the root, ``1.2.3`` the third child of the root's second), at
    ``depth`` (the number of parts of ``path``); ``kind`` is ``planner`` or ``executor``;
    ``goal`` is what it was asked to do, ``step_id`` the step of its parent's plan it does
    (``None`` for the root) and ``tool`` the tool that step names, if any. ``status`` is one
    of ``pending``, ``running``, ``succeeded``, ``partial``, ``failed``, ``cancelled``,
    ``rejected``, ``budget_exhausted``, ``paused`` or ``skipped`` (the root of a run that did not
    start); ``output`` is its result as text and
    ``error`` why it did not succeed. ``usage``, ``cost_pico``, ``planning_cost_pico`` and
    ``execution_cost_pico`` (in USD: ``cost_usd``, ...) count its own ``calls`` only
    (``subtree_cost_usd`` adds the nodes below), ``unpriced_calls`` those without a known
    price. ``plan_versions`` holds every plan a planner proposed, with the gate's decisions;
    ``children`` are the nodes of its steps.
    ``started_at`` and ``finished_at`` are Unix times, ``attempts`` how many times the step
    was tried, ``budget`` its figures under a run budget (``None`` without one) and ``flags``
    marks such as ``overrun``, or ``blocked`` (its tool was blocked: its plan may run the step
    again, as a new node). ``tool_calls`` holds each tool call it made, in the order they
    finished (:class:`ToolCallRecord`). ``transient_retries`` counts the rounds of retries
    its model calls got after a pause, having spent their own on transient errors.
    ``parsed_at`` and ``dispatched_at`` (Unix times, steps of a streamed plan only) say when
    the step's line was read and when it was handed to the scheduler; it started when its
    dependencies were done (``started_at``).
    """

    path: str
    kind: NodeKind
    goal: str
    depth: int
    step_id: str | None = None
    tool: str | None = None
    status: NodeStatus = "pending"
    # One shared zero (Usage is frozen; add_call replaces it): not a new one per node.
    usage: Usage = _NO_USAGE
    cost_pico: Annotated[Pico, Field(alias="cost_usd")] = 0
    planning_cost_pico: Annotated[Pico, Field(alias="planning_cost_usd")] = 0
    execution_cost_pico: Annotated[Pico, Field(alias="execution_cost_usd")] = 0
    unpriced_calls: int = 0
    calls: list[CallRecord] = field(default_factory=list)
    plan_versions: list[PlanVersion] = field(default_factory=list)
    children: list[NodeRecord] = field(default_factory=list)
    started_at: float | None = None
    finished_at: float | None = None
    attempts: int = 0
    output: str | None = None
    error: str | None = None
    budget: dict[str, Any] | None = None
    flags: list[str] = field(default_factory=list)
    # Last, and empty by default: a run.json written before tool calls were recorded loads.
    tool_calls: list[ToolCallRecord] = field(default_factory=list)
    # Zero by default: a run.json written before these rounds were counted loads.
    transient_retries: int = 0
    # Last, None by default: a run.json written before plans streamed loads. When the step's
    # line of a streamed plan was read, and when the step was handed to the scheduler.
    parsed_at: float | None = None
    dispatched_at: float | None = None

    def add_call(self, call: CallRecord) -> None:
        """Record a call and add its usage and cost to this node's totals."""
        self.calls.append(call)
        self.usage = self.usage + call.usage
        cost = call.cost_pico
        if cost is None:
            self.unpriced_calls += 1
            return
        self.cost_pico += cost
        if call.phase == "planning":
            self.planning_cost_pico += cost
        else:
            self.execution_cost_pico += cost

    @property
    def cost_usd(self) -> float:
        """The node's own calls' cost in USD."""
        return self.cost_pico / PICO_PER_USD

    @property
    def planning_cost_usd(self) -> float:
        """What the node's own planning calls cost, in USD."""
        return self.planning_cost_pico / PICO_PER_USD

    @property
    def execution_cost_usd(self) -> float:
        """What the node's own executor calls cost, in USD."""
        return self.execution_cost_pico / PICO_PER_USD

    def walk(self) -> Iterator[NodeRecord]:
        """This node and every node below it, depth first, parents before children."""
        stack = [self]
        while stack:
            node = stack.pop()
            yield node
            stack.extend(reversed(node.children))

    @property
    def subtree_cost_pico(self) -> int:
        """Cost of this node and everything below it, in pico-dollars."""
        return sum(node.cost_pico for node in self.walk())

    @property
    def subtree_cost_usd(self) -> float:
        """Cost of this node and everything below it, in USD."""
        return self.subtree_cost_pico / PICO_PER_USD

    @property
    def duration_s(self) -> float | None:
        """Wall time from start to finish, when both are known."""
        if self.started_at is None or self.finished_at is None:
            return None
        return self.finished_at - self.started_at

    def find(self, path: str) -> NodeRecord:
        """The node at ``path`` (``1.2.3``) in this subtree."""
        for node in self.walk():
            if node.path == path:
                return node
        raise KeyError(path)


@dataclass(slots=True)
class RunResult:
    """The outcome of a run: status, answer, and the whole tree with usage and cost.

    ``status`` is ``succeeded``, ``partial``, ``failed``, ``rejected``, ``cancelled``,
    ``paused`` or ``skipped`` (the run did not start; ``reason`` says why: ``budget`` when its
    parent budget could not grant its budget) (:attr:`ok` says whether it succeeded);
    ``answer`` is the final answer, and ``answer_complete`` false unless the run succeeded (the
    answer then covers what was done; :meth:`not_done` lists the rest); ``error`` says why a
    run did not succeed. ``tree`` is the
    root :class:`NodeRecord` (:meth:`nodes` walks every node; :meth:`levels` and
    :meth:`totals` give the rollups). ``run_id``, ``goal``, ``strategy``, ``model``,
    ``scenario``, ``seed`` and ``settings`` say what ran; ``started_at`` and ``finished_at``
    are Unix times. ``simulated`` is true when any answer came from the offline simulator or a
    test double. ``verification`` is a scenario's check of the result (``ok``, ``summary``,
    ``details``; ``None`` without one), ``stats`` holds figures such as
    ``peak_concurrent_leaves``, ``price_table`` the version of the price table used, ``budget`` the
    run budget's limit and spend (``None`` without a budget), and ``format`` the version of the
    record's layout. :meth:`write` saves it as ``run.json``; :meth:`load` reads one back.
    """

    run_id: str
    goal: str
    strategy: str
    model: str
    simulated: bool
    status: RunStatus
    answer: str
    tree: NodeRecord
    answer_complete: bool = True
    started_at: float = 0.0
    finished_at: float = 0.0
    scenario: str | None = None
    seed: int | None = None
    error: str | None = None
    settings: dict[str, Any] = field(default_factory=dict)
    verification: dict[str, Any] | None = None
    stats: dict[str, Any] = field(default_factory=dict)
    price_table: str = ""
    budget: dict[str, Any] | None = None
    format: int = RECORD_FORMAT
    # Last, and None by default: a run.json written before runs could be skipped loads.
    reason: str | None = None

    @property
    def ok(self) -> bool:
        """True when the run succeeded."""
        return self.status == "succeeded"

    def nodes(self) -> Iterator[NodeRecord]:
        """Every node of the tree."""
        return self.tree.walk()

    def levels(self) -> list[dict[str, Any]]:
        """Rollups per depth: nodes, tokens and cost of the nodes at that depth."""
        rows: dict[int, dict[str, Any]] = {}
        costs: dict[int, int] = {}
        for node in self.nodes():
            row = rows.setdefault(
                node.depth,
                {
                    "depth": node.depth,
                    "nodes": 0,
                    "input_tokens": 0,
                    "output_tokens": 0,
                    "cost_usd": 0.0,
                },
            )
            row["nodes"] += 1
            row["input_tokens"] += node.usage.input_tokens
            row["output_tokens"] += node.usage.output_tokens
            costs[node.depth] = costs.get(node.depth, 0) + node.cost_pico
        for depth, pico in costs.items():
            rows[depth]["cost_usd"] = pico / PICO_PER_USD
        return [rows[d] for d in sorted(rows)]

    def totals(self) -> dict[str, Any]:
        """Rollups over the whole run, split by phase."""
        out: dict[str, Any] = {
            "input_tokens": 0,
            "output_tokens": 0,
            "cached_input_tokens": 0,
            "reasoning_tokens": 0,
            "cache_write_tokens": 0,
            "cache_write_1h_tokens": 0,
            "calls": 0,
            "cost_usd": 0.0,
            "planning_cost_usd": 0.0,
            "execution_cost_usd": 0.0,
            "unpriced_calls": 0,
            "nodes": 0,
        }
        cost = planning = 0
        for node in self.nodes():
            out["nodes"] += 1
            out["input_tokens"] += node.usage.input_tokens
            out["output_tokens"] += node.usage.output_tokens
            out["cached_input_tokens"] += node.usage.cached_input_tokens
            out["reasoning_tokens"] += node.usage.reasoning_tokens
            out["cache_write_tokens"] += node.usage.cache_write_tokens
            out["cache_write_1h_tokens"] += node.usage.cache_write_1h_tokens
            out["calls"] += len(node.calls)
            out["unpriced_calls"] += node.unpriced_calls
            cost += node.cost_pico
            planning += node.planning_cost_pico
        out["cost_usd"] = cost / PICO_PER_USD
        out["planning_cost_usd"] = planning / PICO_PER_USD
        out["execution_cost_usd"] = (cost - planning) / PICO_PER_USD
        return out

    def not_done(self) -> list[dict[str, str]]:
        """What the run did not get done: each step of the final plans whose node did not
        succeed (the deepest planner that still has a plan says which), with its status and why.

        Steps replaced or dropped by a replan are not listed; the plan that replaced them is.
        Each entry has four keys: ``path`` (the node's path, or ``<planner path>:<step id>``
        for a step that never started), ``goal`` (the node's goal or the step's title),
        ``status`` (``failed``, ``cancelled``, ``budget_exhausted``, ``not started``, ...;
        ``left out`` for the part of a goal a plan says it leaves out) and ``reason`` (the
        error, or the status when there is none).
        """
        out: list[dict[str, str]] = []
        stack = [self.tree]
        while stack:
            node = stack.pop()
            if node.status == "succeeded":
                continue
            plan = _final_plan(node)
            if plan is None:
                out.append(_undone(node.path, node.goal, node.status, node.error))
                continue
            if plan.left_out:
                out.append(_undone(node.path, node.goal, "left out", plan.left_out))
            latest = {c.step_id: c for c in node.children if c.step_id is not None}
            below: list[NodeRecord] = []
            for step in plan.steps:
                child = latest.get(step.id)
                if child is None:
                    out.append(_undone(f"{node.path}:{step.id}", step.title, "not started", None))
                elif child.status != "succeeded":
                    below.append(child)
            stack.extend(reversed(below))
        return out

    def to_dict(self) -> dict[str, Any]:
        """The JSON-ready record, with rollups and each node's subtree cost."""
        data: dict[str, Any] = _ADAPTER.dump_python(self, mode="json", by_alias=True)
        _add_subtree_costs(data["tree"], self.tree)
        data["levels"] = self.levels()
        data["totals"] = self.totals()
        return data

    def to_json(self) -> str:
        """The record as indented JSON text (text in any script as it is: the file is UTF-8),
        with credentials taken out of its text (:func:`hierplan.redact.redact`): a key pasted
        into a goal, or a URL with a password that an error quotes, is not kept in the file."""
        data = self.to_dict()
        replace_strings(data, redact, keep=KEPT_AS_WRITTEN)
        # pydantic-core's encoder rather than json.dumps, which with an indent runs Python's
        # pure-Python encoder: about 150 µs a node, more than the run's own orchestration.
        try:
            return pydantic_core.to_json(data, indent=1).decode()
        except pydantic_core.PydanticSerializationError:
            # A lone surrogate (a model's JSON reply may hold "\ud800") has no UTF-8: it is
            # written as U+FFFD, not left to fail the whole record.
            return pydantic_core.to_json(map_strings(data, encodable), indent=1).decode()

    def write(self, path: StrPath) -> Path:
        """Write ``run.json`` atomically (a reader never sees half a file); returns the path."""
        path = Path(path)
        make_directory(path.parent, "the run record's directory")
        write_atomic(path, self.to_json())
        return path

    @classmethod
    def load(cls, path: StrPath) -> RunResult:
        """Read a ``run.json``; a missing or malformed file raises :class:`UserInputError`."""
        path = Path(path)
        try:
            # Not a pipe or a device, which may never end; utf-8-sig: a byte-order mark that an
            # editor put in front is not JSON.
            with open_regular_file(path, "run record") as stream:
                text = stream.read().decode("utf-8-sig")
        except OSError as exc:
            raise UserInputError(f"cannot read {path}: {exc.strerror or exc}") from None
        except UnicodeDecodeError as exc:
            raise UserInputError(
                f"{path} is not a hierplan run record: not UTF-8 text (byte {exc.start})"
            ) from None
        try:
            return _ADAPTER.validate_json(text)
        except ValidationError as exc:
            raise UserInputError(
                f"{path} is not a hierplan run record ({exc.error_count()} problem(s); "
                f"first at {first_problem(exc)})"
            ) from None


def _final_plan(node: NodeRecord) -> Plan | None:
    """The last plan the gate approved (an edit is approved as a version of its own)."""
    for version in reversed(node.plan_versions):
        if version.decision == "approved":
            return version.plan
    return None


def _undone(path: str, goal: str, status: str, error: str | None) -> dict[str, str]:
    return {"path": path, "goal": goal, "status": status, "reason": error or status}


def subtree_costs(root: NodeRecord) -> dict[str, int]:
    """Each node's subtree cost in pico-dollars by path, in one walk."""
    costs: dict[str, int] = {}

    def visit(node: NodeRecord) -> int:
        total = node.cost_pico + sum(visit(child) for child in node.children)
        costs[node.path] = total
        return total

    visit(root)
    return costs


def _add_subtree_costs(data: dict[str, Any], node: NodeRecord) -> None:
    costs = subtree_costs(node)
    stack = [data]
    while stack:
        item = stack.pop()
        item["subtree_cost_usd"] = costs[item["path"]] / PICO_PER_USD
        stack.extend(item["children"])


_ADAPTER: TypeAdapter[RunResult] = TypeAdapter(RunResult)
