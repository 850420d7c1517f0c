"""The context every node runs with.

A :class:`RunContext` holds what the whole run shares (settings, tools, models, limits, event
bus, instruments). Each node gets a :class:`NodeContext`: its record, its parent, the step that
made it, its tool allowlist, and its model. The two implement the core's views
(:class:`~hierplan.core.views.RunView`, :class:`~hierplan.core.views.NodeView`) that
instruments read, and a node is the :class:`~hierplan.core.views.StepEnv` its planner or
executor works in.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, Coroutine, Mapping, Sequence
from functools import partial
from types import MappingProxyType
from typing import Any

import anyio

from hierplan.agents.executor import DecidedCall, LLMExecutor, ToolExecutor
from hierplan.agents.planner import LLMPlanner
from hierplan.core.events import EventBus
from hierplan.core.instrument import Instrument
from hierplan.core.settings import RunSettings
from hierplan.core.spend import Cost, Spending
from hierplan.core.views import Allocation, PlanNeeds, Resumed, SpanIds, StepWork
from hierplan.durable.restore import Restore
from hierplan.errors import ToolError
from hierplan.hierarchy import calls
from hierplan.hierarchy.gate import Gate
from hierplan.hierarchy.pause import PauseControl
from hierplan.hierarchy.scheduler import Slots
from hierplan.models.base import (
    Model,
    ModelRequest,
    ModelResponse,
    StreamItem,
    ToolSpec,
    stream_of,
)
from hierplan.models.counting import InputCounter
from hierplan.models.tokens import estimate_input_tokens
from hierplan.plans.plan import Plan, Step
from hierplan.pricing import PriceTable
from hierplan.records import NodeKind, NodeRecord, PlanVersion, RunStatus
from hierplan.tools.base import Tool, Toolbox


class RunContext:
    """What a whole run shares. Built by :func:`hierplan.run`; one per run, nothing global."""

    def __init__(
        self,
        *,
        run_id: str,
        settings: RunSettings,
        toolbox: Toolbox,
        planner_model: Model,
        executor_model: Model,
        pricing: PriceTable,
        instruments: Sequence[Instrument] = (),
        bus: EventBus | None = None,
        gate: Gate | None = None,
        planner: LLMPlanner | None = None,
        restore: Restore | None = None,
    ) -> None:
        self.run_id = run_id
        self.settings = settings
        self.toolbox = toolbox
        self.planner_model = planner_model
        self.executor_model = executor_model
        self.pricing = pricing
        self.instruments = tuple(instruments)
        self.bus = bus or EventBus(run_id)
        self.gate = gate or Gate()
        self.planner = planner or LLMPlanner()
        # A resumed run: what to continue from (see hierplan.durable.restore).
        self.restore = restore
        self.pause = PauseControl(None if restore is None else restore.results)
        self.tool_executor = ToolExecutor()
        self.llm_executor = LLMExecutor()
        # How the input of a planner's and an executor's calls is counted before they go out
        # (what a budget reserves): the estimate unless the run's budget says otherwise.
        self.counters: tuple[InputCounter, InputCounter] = (
            estimate_input_tokens,
            estimate_input_tokens,
        )
        self.leaf_limiter = Slots(settings.concurrency)
        self.retry_policy = calls.retry_policy(settings)
        self.active_leaves = 0
        self.peak_leaves = 0
        # The run sets the scope while its nodes run; cancel() ends the run as "cancelled".
        self.cancel_scope: anyio.CancelScope | None = None
        self.cancel_requested = False
        self.nodes_finished = False
        # Set once the nodes have finished, before the run's scopes close: what an instrument
        # may read as its run scope ends (stays None when the run raises).
        self.status: RunStatus | None = None
        # The run's workflow span when a tracing instrument recorded it: a checkpoint keeps it,
        # so that the trace of the resumed run can link to this one.
        self.workflow_span: SpanIds | None = None
        # What each instrument keeps for this run alone (keyed by the instrument), so that
        # one instrument can serve many runs without mixing them.
        self.state: dict[object, Any] = {}

    @property
    def pausing(self) -> bool:
        """Whether the run is stopping to wait for a review."""
        return self.pause.pausing

    @property
    def resumed(self) -> Resumed | None:
        """What a resumed run carries over from before its pause (``None`` for a new run)."""
        return None if self.restore is None else self.restore.resumed

    def cancel(self) -> bool:
        """Stop the run from outside: every node task is cancelled, the record says cancelled.

        Returns ``False`` when the run's nodes had already finished (the run keeps its
        status), ``True`` otherwise. Safe to call more than once, and before the nodes start.
        """
        if self.nodes_finished:
            return False
        self.cancel_requested = True
        if self.cancel_scope is not None:
            self.cancel_scope.cancel()
        return True

    def leaf_started(self) -> None:
        """Count a leaf that started running (for the peak-concurrency statistic)."""
        self.active_leaves += 1
        if self.active_leaves > self.peak_leaves:
            self.peak_leaves = self.active_leaves

    def leaf_finished(self) -> None:
        """Count a leaf that stopped running."""
        self.active_leaves -= 1


class NodeContext:
    """One node's context: its record, parent, step, tools and model (see the module
    docstring)."""

    __slots__ = (
        "_model",
        "_work",
        "_work_of",
        "allocation",
        "allowed_tools",
        "decided_call",
        "parent",
        "record",
        "refusal",
        "run",
        "state",
        "step",
        "step_costs",
    )

    def __init__(
        self,
        run: RunContext,
        record: NodeRecord,
        *,
        parent: NodeContext | None = None,
        step: Step | None = None,
        allowed_tools: frozenset[str],
    ) -> None:
        self.run = run
        self.record = record
        self.parent = parent
        self.step = step
        self.allowed_tools = allowed_tools
        self.state: dict[object, Any] = {}
        # Set by a budget's node scope; the node's node_started event carries it.
        self.allocation: Allocation | None = None
        self._model: Model | None = None
        # The least cost of each step of the node's approved plan, when a budget limits it:
        # the floor of each step's share under the ``need`` allocation.
        self.step_costs: Mapping[str, Cost] = _NO_COSTS
        self._work: StepWork | None = None
        self._work_of: Step | None = None
        # A tool step's call decided again after the tool refused the plan's, and that
        # refusal (leaf.py).
        self.decided_call: DecidedCall | None = None
        self.refusal: ToolError | None = None

    @property
    def path(self) -> str:
        """The node's path, ``1`` for the root, ``1.2.3`` below."""
        return self.record.path

    @property
    def depth(self) -> int:
        """1 for the root."""
        return self.record.depth

    @property
    def goal(self) -> str:
        """What the node is to do."""
        return self.record.goal

    @property
    def context(self) -> str:
        """The goal of the planner above (``""`` for the root)."""
        return "" if self.parent is None else self.parent.record.goal

    @property
    def settings(self) -> RunSettings:
        """The run's settings."""
        return self.run.settings

    @property
    def work(self) -> StepWork | None:
        """What the step behind this node asks for (``None`` for the root)."""
        step = self.step
        if step is None:
            return None
        if self._work_of is not step:  # made once per step (a replan may give a new one)
            self._work = step_work(step)
            self._work_of = step
        return self._work

    @property
    def base_model(self) -> Model:
        """This node's model as the run was given it, before any instrument wrapped it: the
        one whose provider may add input of its own (see :func:`~hierplan.models.tokens.
        estimate_input_tokens`), which budgets, the record and the trace estimate alike."""
        return self.run.planner_model if self.record.kind == "planner" else self.run.executor_model

    @property
    def model(self) -> Model:
        """This node's model as its planner or executor calls it (built on first use; see
        :func:`hierplan.hierarchy.calls.node_model`)."""
        if self._model is None:
            self._model = calls.node_model(self)
        return self._model

    def count_input(self, request: ModelRequest) -> int:
        """The input tokens of ``request`` on this node's model, counted as the run's budget
        reserves them (see :mod:`hierplan.models.counting`)."""
        counters = self.run.counters
        counter = counters[0] if self.record.kind == "planner" else counters[1]
        return counter(request, self.base_model)

    async def spending(self) -> Spending | None:
        """What this node may still spend, from the first instrument that limits it, with how
        its budget counts a request's input (see :mod:`hierplan.core.spend`)."""
        run = self.run
        for instrument in run.instruments:
            funds = await instrument.funds(self)
            if funds is not None:
                planning, execution = run.counters
                return Spending(
                    funds,
                    partial(planning, model=run.planner_model),
                    partial(execution, model=run.executor_model),
                )
        return None

    def forget_model(self) -> None:
        """Drop the wrapped model once the node has finished. Wrappers refer back to their
        node, so without this a finished node's context would wait for the garbage collector
        instead of going as soon as nothing uses it (the model is built again if needed)."""
        self._model = None

    def plan_needs(self, include: str | None = None) -> PlanNeeds | None:
        """The model-using steps of this node's current plan whose nodes have not started
        (and step ``include``, started or not)."""
        versions = self.record.plan_versions
        if not versions:
            return None
        latest = {c.step_id: c for c in self.record.children if c.step_id is not None}
        steps = {}
        for step in _running_plan(versions).steps:
            work = step_work(step)
            record = latest.get(step.id)
            started = record is not None and record.status != "pending"
            if work.direct or (started and step.id != include):
                continue
            steps[step.id] = work
        return PlanNeeds(len(versions), steps, self.step_costs)

    def tool(self, name: str, allowed: frozenset[str] | None = None) -> Tool:
        """The tool ``name`` if this node (or the narrower ``allowed``) may call it."""
        return self.run.toolbox.get(name, self.allowed_tools if allowed is None else allowed)

    def tool_specs(self, allowed: frozenset[str] | None = None) -> tuple[ToolSpec, ...]:
        """The specs of the tools this node (or the narrower ``allowed``) may call."""
        return self.run.toolbox.specs(self.allowed_tools if allowed is None else allowed)

    def call_model(self, request: ModelRequest) -> Coroutine[Any, Any, ModelResponse]:
        """Call this node's model: retried, budgeted, recorded and traced (see
        :mod:`hierplan.hierarchy.calls`)."""
        # The model's own coroutine, not one more around it: a leaf waits in every frame of
        # its chain, and each one is memory and collector work for as long as it waits.
        return self.model.request(request)

    def stream_model(self, request: ModelRequest) -> AsyncGenerator[StreamItem, None]:
        """Stream this node's model's answer: retried before its first delta, budgeted and
        recorded as :meth:`call_model`; closed early, it counts for what it wrote."""
        return stream_of(self.model, request)

    def call_tool(
        self,
        target: Tool,
        arguments: Mapping[str, Any],
        call_id: str,
        *,
        references: bool = False,
        planned: Mapping[str, Any] | None = None,
    ) -> Coroutine[Any, Any, Any]:
        """Call a tool inside every instrument's tool scope and record it on this node."""
        return calls.call_tool(  # its coroutine, not one more around it (see call_model)
            self, target, arguments, call_id, references=references, planned=planned
        )

    def child(
        self, number: int, kind: NodeKind, goal: str, step: Step | None = None
    ) -> NodeContext:
        """Create the child node ``<path>.<number>`` and add it to this node's record."""
        parent = self.record
        record = NodeRecord(
            f"{parent.path}.{number}",
            kind,
            goal,
            parent.depth + 1,
            None if step is None else step.id,
            None if step is None else step.tool,
        )
        parent.children.append(record)
        allowed = self.allowed_tools
        if step is not None and step.tools is not None:
            allowed = allowed & frozenset(step.tools)
        return NodeContext(self.run, record, parent=self, step=step, allowed_tools=allowed)


_NO_COSTS: Mapping[str, Cost] = MappingProxyType({})


def step_work(step: Step) -> StepWork:
    """What ``step`` asks for, as instruments see it."""
    direct = step.kind == "task" and step.tool is not None and step.args is not None
    return StepWork(step.id, step.tool, direct, step.estimate_tokens, step.estimate_usd)


def _running_plan(versions: list[PlanVersion]) -> Plan:
    """The plan a node runs: its last approved version (its latest proposal before any)."""
    for version in reversed(versions):
        if version.decision == "approved":
            return version.plan
    return versions[-1].plan
