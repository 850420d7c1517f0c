"""Read-only views of a run and of a node, and the environment of one step.

The orchestration (:mod:`hierplan.hierarchy`) implements these protocols; everything that wraps
it reads a run through them: instruments (budgets, tracing, a user's own) get a
:class:`RunView` and :class:`NodeView`, planners and executors a :class:`StepEnv`. None of
them sees how the orchestration is built, so it can change without them.

Views are read-only but for what an instrument owns: the ``state`` mappings (what it keeps
per run or per node, under a key of its own), the fields of a node's record that instruments
fill in (``budget``, ``flags``), and a node's ``allocation`` (which its ``node_started`` event
carries).
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, Coroutine, Mapping
from dataclasses import dataclass, field
from typing import Any, NamedTuple, Protocol

from pydantic import BaseModel, ConfigDict, Field

from hierplan.core.events import EventBus
from hierplan.core.settings import RunSettings
from hierplan.core.spend import Cost, Spending
from hierplan.models.base import Model, ModelRequest, ModelResponse, StreamItem, ToolSpec
from hierplan.pricing import PriceTable
from hierplan.records import NodeRecord, RunStatus
from hierplan.tools.base import Tool


class SpanIds(BaseModel):
    """A span's trace id and span id, in hex as trace backends show them: the paused run's
    workflow span, which the trace of the resumed run links to."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    trace_id: str = Field(pattern=r"^[0-9a-f]{32}$")
    span_id: str = Field(pattern=r"^[0-9a-f]{16}$")


@dataclass(slots=True, frozen=True)
class Resumed:
    """What a resumed run carries over from the part that ran before it paused: what that part
    spent (the budget goes on from there) and its workflow span (the new trace links to it)."""

    spent_tokens: int = 0
    spent_pico: int = 0
    workflow_span: SpanIds | None = None


class StepWork(NamedTuple):
    """What the plan step behind a node asks for, as instruments need to know it: its id, the
    tool it names, whether it is a direct tool call (a tool and its arguments: no model call),
    and the plan's estimate of its cost. (A named tuple: one is made for every step.)"""

    step_id: str
    tool: str | None
    direct: bool
    estimate_tokens: int | None = None
    estimate_usd: float | None = None


class Allocation(NamedTuple):
    """What a node was granted to spend, as a budget instrument sets it when the node's account
    opens: tokens and USD, ``None`` in a dimension that is unlimited (or, for USD, untracked)."""

    tokens: int | None
    usd: float | None


@dataclass(slots=True, frozen=True)
class PlanNeeds:
    """The model-using steps of a node's current plan that have not started yet, with their
    estimates: what a budget splits the node's money by. ``version`` is the plan version;
    ``least`` the least each step of the plan costs, when a budget check computed it."""

    version: int
    steps: Mapping[str, StepWork]
    least: Mapping[str, Cost] = field(default_factory=dict)


class RunView(Protocol):
    """One run as instruments see it."""

    @property
    def run_id(self) -> str:
        """The run's id."""
        ...

    @property
    def settings(self) -> RunSettings:
        """The run's settings."""
        ...

    @property
    def pricing(self) -> PriceTable:
        """The price table every call of the run is priced by."""
        ...

    @property
    def bus(self) -> EventBus:
        """The run's event bus (subscribe to it; instruments emit budget events on it)."""
        ...

    @property
    def planner_model(self) -> Model:
        """The planners' model, as the run was given it."""
        ...

    @property
    def executor_model(self) -> Model:
        """The executors' model, as the run was given it."""
        ...

    @property
    def status(self) -> RunStatus | None:
        """The run's status once its nodes have finished (``None`` before, or when it raised)."""
        ...

    @property
    def active_leaves(self) -> int:
        """Leaves running now (each holding one of the run's places for a leaf)."""
        ...

    @property
    def cancel_requested(self) -> bool:
        """Whether someone cancelled the run."""
        ...

    @property
    def pausing(self) -> bool:
        """Whether the run is stopping to wait for a review."""
        ...

    @property
    def peak_leaves(self) -> int:
        """The most executor steps that ran at once so far."""
        ...

    @property
    def resumed(self) -> Resumed | None:
        """What the run carries over from before a pause, when it is a resumed run."""
        ...

    @property
    def state(self) -> dict[object, Any]:
        """What each instrument keeps for this run, under a key of its own."""
        ...

    workflow_span: SpanIds | None
    """The run's workflow span, set by a tracing instrument: a checkpoint keeps it."""


class NodeView(Protocol):
    """One node of a run (a planner or an executor) as instruments see it."""

    @property
    def run(self) -> RunView:
        """The run the node belongs to."""
        ...

    @property
    def record(self) -> NodeRecord:
        """The node's record (instruments write only ``budget`` and ``flags``)."""
        ...

    @property
    def parent(self) -> NodeView | None:
        """The planner node above, ``None`` for the root."""
        ...

    @property
    def path(self) -> str:
        """``1`` for the root, ``1.2.3`` below."""
        ...

    @property
    def depth(self) -> int:
        """1 for the root."""
        ...

    @property
    def state(self) -> dict[object, Any]:
        """What each instrument keeps for this node, under a key of its own."""
        ...

    @property
    def base_model(self) -> Model:
        """The node's model as the run was given it (before any instrument wrapped it)."""
        ...

    @property
    def work(self) -> StepWork | None:
        """What the step behind this node asks for; ``None`` for the root."""
        ...

    allocation: Allocation | None
    """The node's allocation, set by a budget instrument's node scope (``None`` without one):
    the node's ``node_started`` event, emitted once every node scope is open, carries it."""

    def plan_needs(self, include: str | None = None) -> PlanNeeds | None:
        """The unstarted model-using steps of this node's current plan (and step ``include``,
        started or not), or ``None`` when it has no plan."""
        ...


class StepEnv(Protocol):
    """What a planner or an executor may use while it works on one node: the model, the tools
    the node may call, and the run's settings. Every call through it is recorded, budgeted
    and traced by the run."""

    @property
    def path(self) -> str:
        """The node's path (``1.2``)."""
        ...

    @property
    def depth(self) -> int:
        """The node's depth (1 for the root)."""
        ...

    @property
    def goal(self) -> str:
        """What the node is to do."""
        ...

    @property
    def context(self) -> str:
        """The goal of the planner above, for an executor's prompt (``""`` at the root)."""
        ...

    @property
    def settings(self) -> RunSettings:
        """The run's settings."""
        ...

    @property
    def allowed_tools(self) -> frozenset[str]:
        """The names of the tools this node may call."""
        ...

    def tool(self, name: str, allowed: frozenset[str] | None = None) -> Tool:
        """The tool ``name``, if the node (or the narrower ``allowed``) may call it; else a
        :class:`~hierplan.errors.ToolNotAllowedError`."""
        ...

    def tool_specs(self, allowed: frozenset[str] | None = None) -> tuple[ToolSpec, ...]:
        """The specs of the tools the node (or the narrower ``allowed``) may call."""
        ...

    def call_model(self, request: ModelRequest) -> Coroutine[Any, Any, ModelResponse]:
        """Call the node's model (retried, budgeted, recorded and traced): await what it
        returns."""
        ...

    def stream_model(self, request: ModelRequest) -> AsyncGenerator[StreamItem, None]:
        """Stream the node's model's answer (text deltas, then the response), counted as
        :meth:`call_model` counts a call; close it early to cancel the call."""
        ...

    async def spending(self) -> Spending | None:
        """What the node may still spend and how its budget costs a call (``None`` when no
        budget limits it)."""
        ...

    def call_tool(
        self,
        target: Tool,
        arguments: Mapping[str, Any],
        call_id: str,
        *,
        references: bool = False,
        planned: Mapping[str, Any] | None = None,
    ) -> Coroutine[Any, Any, Any]:
        """Call a tool (inside every instrument's tool scope; recorded on the node): await
        what it returns.
        ``planned``: the plan's own arguments these come from, when they hold no reference to
        an earlier step's output (the gate's check of them is then not made again)."""
        ...
