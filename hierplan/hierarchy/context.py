"""The typed context every node runs with, and the seam for budgets and tracing.

A :class:`RunContext` holds what the whole run shares (settings, tools, models, limits, event
bus, instruments). Each node gets a :class:`NodeContext`: its record, its parent, the step that
made it, its tool allowlist, and its model, wrapped by every instrument.

An :class:`Instrument` is how budgets, tracing and event streams plug in without touching
providers or strategies: it may wrap the model of a node, and open a scope around the run, a
node, a planning call or a tool call. Scopes that an instrument does not need return ``None``,
so an unused hook costs one attribute call on the hot path.
"""

from __future__ import annotations

import random
import time
from collections.abc import Mapping, Sequence
from contextlib import AbstractAsyncContextManager, AsyncExitStack
from typing import Any, Literal

import anyio
from pydantic import BaseModel, ConfigDict, Field

from hierplan.agents.executor import LLMExecutor, ToolExecutor
from hierplan.agents.planner import LLMPlanner
from hierplan.core.events import EventBus, ModelCalled, StepRetried
from hierplan.errors import HierplanError, ModelError, stray_cancellation
from hierplan.hierarchy.gate import Gate
from hierplan.hierarchy.pause import PauseControl, Restore, SpanIds
from hierplan.hierarchy.scheduler import Slots
from hierplan.models.base import Model, ModelRequest, ModelResponse, ToolCall, Usage
from hierplan.models.tokens import counted_usage, failed_usage, worst_case
from hierplan.plans.plan import DEFAULT_MAX_DEPTH, DEFAULT_MAX_STEPS, Step
from hierplan.pricing import PriceTable
from hierplan.records import CallRecord, NodeKind, NodeRecord, RunStatus
from hierplan.tools.base import Toolbox

StrategyName = Literal["react", "plan-execute", "replan", "dag", "hierarchical", "as-needed"]
STRATEGY_NAMES: tuple[str, ...] = (
    "react",
    "plan-execute",
    "replan",
    "dag",
    "hierarchical",
    "as-needed",
)


# Upper bounds of the settings: past them a run waits or retries for so long that it looks
# hung (an infinite or NaN delay never ends), so such a value is refused as a mistake.
DAY_S = 86_400.0
"""The longest time setting (a delay, a deadline), in seconds: a day."""
MAX_RETRIES = 100
"""The most retries, replans, rejections or invalid plans a setting may allow."""
MAX_TURNS = 1_000
"""The most model turns of an executor step or a ReAct run."""
MAX_OUTPUT_TOKENS = 1_000_000
"""The largest ``planner_max_tokens``/``executor_max_tokens``: more than any model writes."""
MAX_SEED = 2**31 - 1
"""The largest simulator seed: the same range on the command line, in goal files and goal lines
(a goal's seed derived from the batch's is 31 bits, so any goal's seed fits)."""


class RunSettings(BaseModel):
    """Limits and knobs of one run. Every field has a default a user would expect.

    Times are finite seconds up to :data:`DAY_S` (a day); counts of retries, replans,
    rejections and invalid plans go up to :data:`MAX_RETRIES`, model turns up to
    :data:`MAX_TURNS`, output tokens up to :data:`MAX_OUTPUT_TOKENS`: beyond them a run would
    wait or retry for ever. On the command line a setting is ``--set name=value``.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    strategy: StrategyName = Field(
        "hierarchical", description="How the goal is planned and run (see STRATEGY_NAMES)."
    )
    max_depth: int = Field(DEFAULT_MAX_DEPTH, ge=1, le=10, description="Deepest plan level.")
    concurrency: int = Field(8, ge=1, description="Executor steps running at once, run-wide.")
    plan_concurrency: int = Field(8, ge=1, description="Steps of one plan running at once.")
    max_steps: int = Field(DEFAULT_MAX_STEPS, ge=1, description="Steps allowed in one plan.")
    max_retries: int = Field(
        2, ge=0, le=MAX_RETRIES, description="Retries of a failed step before replanning."
    )
    retry_backoff_s: float = Field(
        0.2,
        ge=0,
        le=DAY_S,
        allow_inf_nan=False,
        description="First retry delay of a step or a model call; doubles each time, up to a cap.",
    )
    retry_max_delay_s: float = Field(
        60.0,
        ge=0,
        le=DAY_S,
        allow_inf_nan=False,
        description="Longest wait before a step retry: the doubling stops there.",
    )
    max_replans: int = Field(
        2, ge=0, le=MAX_RETRIES, description="Replans per node after failures."
    )
    max_rejections: int = Field(
        3, ge=0, le=MAX_RETRIES, description="Plans a node may have rejected."
    )
    max_invalid_plans: int = Field(
        2, ge=0, le=MAX_RETRIES, description="Invalid plans a node may propose."
    )
    step_timeout_s: float | None = Field(
        300.0, gt=0, le=DAY_S, allow_inf_nan=False, description="Deadline of one step."
    )
    executor_max_turns: int = Field(
        8, ge=1, le=MAX_TURNS, description="Model turns of an executor step."
    )
    react_max_turns: int = Field(30, ge=1, le=MAX_TURNS, description="Model turns of a ReAct run.")
    planner_max_tokens: int = Field(
        4096,
        ge=16,
        le=MAX_OUTPUT_TOKENS,
        description="Output tokens a planning call may use (a budget reserves them).",
    )
    executor_max_tokens: int = Field(
        1024,
        ge=16,
        le=MAX_OUTPUT_TOKENS,
        description=(
            "Output tokens an executor call may use (a budget reserves them); a reasoning model "
            "spends part of them thinking."
        ),
    )
    model_retries: int = Field(
        3, ge=0, le=MAX_RETRIES, description="Retries of a retryable model error."
    )
    model_retry_max_delay_s: float = Field(
        60.0,
        ge=0,
        le=DAY_S,
        allow_inf_nan=False,
        description="Longest wait before a model retry; a provider asking for more fails the call.",
    )
    seed: int = Field(
        0, ge=0, le=MAX_SEED, description="Seed of the simulator: the same seed, the same run."
    )

    @classmethod
    def checked(cls, values: Mapping[str, Any], *, strict: bool = False) -> dict[str, Any]:
        """Some settings (a goal file's, ``--set``'s) checked as a run would check them, as
        plain data; :class:`pydantic.ValidationError` names each bad one. ``strict``: no
        conversions (``true`` is no count, ``"3"`` no number)."""
        given = dict(values)
        return cls.model_validate(given, strict=strict).model_dump(mode="json", include=set(given))


class Instrument:
    """Base class for budgets, tracing and other wrappers; override only what you need."""

    def wrap_model(self, model: Model, node: NodeContext) -> Model:
        """Return the model ``node`` should call (wrapped, or as is)."""
        return model

    def run_scope(self, run: RunContext) -> AbstractAsyncContextManager[None] | None:
        """A scope around the whole run, or ``None``."""
        return None

    def node_scope(self, node: NodeContext) -> AbstractAsyncContextManager[None] | None:
        """A scope around one node's whole life, or ``None``."""
        return None

    def planning_scope(
        self, node: NodeContext, reason: str
    ) -> AbstractAsyncContextManager[None] | None:
        """A scope around one planning round (the planning model calls), or ``None``."""
        return None

    def tool_scope(
        self, node: NodeContext, call: ToolCall
    ) -> AbstractAsyncContextManager[None] | None:
        """A scope around one tool call, or ``None``."""
        return None


def enter_scopes(
    stack: AsyncExitStack, scopes: Sequence[AbstractAsyncContextManager[None] | None]
) -> Any:
    """Enter the non-``None`` scopes on ``stack`` (in order); returns an awaitable."""

    async def _enter() -> None:
        for scope in scopes:
            if scope is not None:
                await stack.enter_async_context(scope)

    return _enter()


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
        self.pause = PauseControl(restore)
        self.tool_executor = ToolExecutor()
        self.llm_executor = LLMExecutor()
        self.leaf_limiter = Slots(settings.concurrency)
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
    """One node's typed context: its record, parent, step, tools and (wrapped) model."""

    __slots__ = (
        "_model",
        "allowed_tools",
        "held_tokens",
        "parent",
        "record",
        "run",
        "state",
        "step",
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
        self._model: Model | None = None
        # The tokens the call in flight holds, set by a budget wrapper (its max_tokens may
        # have been lowered to fit; 0 before the request goes out): a call cut short is
        # recorded at them, so that the record shows what the budget settled.
        self.held_tokens: int | None = None

    @property
    def path(self) -> str:
        """The node's path, ``1`` for the root, ``1.2.3`` below."""
        return self.record.path

    @property
    def depth(self) -> int:
        """1 for the root."""
        return self.record.depth

    @property
    def base_model(self) -> Model:
        """This node's model as the run was given it, before any instrument wrapped it: the
        one whose provider may add input of its own (see :func:`~hierplan.models.tokens.
        estimate_input_tokens`), which budgets, the record and the trace estimate alike."""
        return self.run.planner_model if self.record.kind == "planner" else self.run.executor_model

    @property
    def model(self) -> Model:
        """This node's model, wrapped by every instrument (built on first use)."""
        if self._model is None:
            base = self.base_model
            for instrument in self.run.instruments:
                base = instrument.wrap_model(base, self)
            self._model = base
        return self._model

    def forget_model(self) -> None:
        """Drop the wrapped model once the node has finished. Wrappers refer back to their
        node, so without this a finished node's context would wait for the garbage collector
        instead of going as soon as nothing uses it (the model is built again if needed)."""
        self._model = None

    def child(
        self, number: int, kind: NodeKind, goal: str, step: Step | None = None
    ) -> NodeContext:
        """Create the child node ``<path>.<number>`` and add it to this node's record."""
        parent = self.record
        # Positional (path, kind, goal, depth, step_id, tool): one per node of the run.
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

    async def call_model(self, request: ModelRequest) -> ModelResponse:
        """Call this node's model, retrying retryable errors, and record every attempt.

        An exception the model raises that is not one of hierplan's (a user's function raising
        ``ValueError``, a connection's ``OSError``) becomes a :class:`ModelError` naming the
        model, so that the retry loop, the record and the planner's fallback treat it as any
        failed call rather than let it end the run with a traceback; an ``OSError`` is as
        transient as a provider's server error. (Caught here rather than in a wrapper
        coroutine: every leaf waiting on its model would hold one more frame.)
        """
        attempt = 0
        while True:
            attempt += 1
            started = time.time()
            t0 = time.perf_counter()
            try:
                response = await self.model.request(request)
            except anyio.get_cancelled_exc_class() as exc:
                self._cut_short(request, started, t0, attempt)  # as its budget settled it
                if not stray_cancellation():
                    raise
                raise ModelError(
                    f"model {self.base_model.name!r} raised {type(exc).__name__} though "
                    "nothing cancelled the call"
                ) from exc
            except ModelError as exc:
                error = exc
            except HierplanError:
                raise
            except Exception as exc:
                error = ModelError(
                    f"model {self.base_model.name!r} raised {type(exc).__name__}: {exc}",
                    retryable=isinstance(exc, OSError),
                )
                error.__cause__ = exc
            else:
                self._record(
                    request,
                    # Budget or not, the record shows what the call may have cost (a budget
                    # wrapper has already set the reply's usage the same way).
                    counted_usage(response, request, model=self.base_model),
                    started,
                    t0,
                    attempt,
                    ok=True,
                    flags=response.flags,
                    model_name=response.model,
                )
                return response
            await anyio.sleep(self._failed_attempt(request, error, started, t0, attempt))

    def _failed_attempt(
        self, request: ModelRequest, exc: ModelError, started: float, t0: float, attempt: int
    ) -> float:
        """Record a failed attempt and return the delay before the next one; raises ``exc``
        (or why it may not be retried) when there is to be no next one."""
        settings = self.run.settings
        used, flag = failed_usage(exc, request, model=self.base_model)
        self._record(
            request,
            used or Usage(),
            started,
            t0,
            attempt,
            ok=False,
            flags=None if flag is None else [flag],
        )
        if not exc.retryable or attempt > settings.model_retries:
            raise exc
        delay = _retry_delay(settings, attempt, exc)
        if delay is None:
            raise ModelError(
                f"{exc} (the provider asked to wait {exc.retry_after:g} s, more than "
                f"model_retry_max_delay_s={settings.model_retry_max_delay_s:g})",
                usage=exc.usage,
                unknown_usage=exc.unknown_usage,
            ) from exc
        if self.run.bus.wants("step_retried"):
            self.run.bus.emit(
                StepRetried(
                    run_id=self.run.run_id,
                    path=self.path,
                    attempt=attempt,
                    error=str(exc),
                    delay_s=delay,
                )
            )
        return delay

    def _cut_short(self, request: ModelRequest, started: float, t0: float, attempt: int) -> None:
        """Record a call cut short (cancelled, a deadline): the provider may have billed it, so
        it counts at its worst case, as its budget settled it."""
        held = self.held_tokens
        self.held_tokens = None
        if held == 0:
            return  # cancelled before the request went out: no call was made
        usage = worst_case(request, model=self.base_model)
        if held is not None:  # what the budget held: max_tokens may have been lowered to fit
            usage = Usage(usage.input_tokens, held - usage.input_tokens)
        self._record(request, usage, started, t0, attempt, ok=False, flags=["cut_short"])

    def _record(
        self,
        request: ModelRequest,
        usage: Usage,
        started: float,
        t0: float,
        attempt: int,
        *,
        ok: bool,
        flags: list[str] | None = None,
        model_name: str = "",
    ) -> None:
        model = self.model
        cost = self.run.pricing.cost(model.priced_as, usage)
        call_flags = list(flags or ())
        if not ok and "cut_short" not in call_flags:  # a call cut short did not fail
            call_flags.append("failed")
        duration = time.perf_counter() - t0
        # Positional, in field order: this runs for every call, and keywords cost more.
        self.record.add_call(
            CallRecord(
                request.phase,
                model_name or model.name,
                request.purpose,
                usage,
                cost,
                started,
                duration,
                attempt,
                ok,
                call_flags,
            )
        )
        if self.run.bus.wants("model_called"):
            self.run.bus.emit(
                ModelCalled(
                    run_id=self.run.run_id,
                    path=self.path,
                    model=model.name,
                    phase=request.phase,
                    input_tokens=usage.input_tokens,
                    output_tokens=usage.output_tokens,
                    cost_usd=cost,
                    duration_s=duration,
                    ok=ok,
                    cached_input_tokens=usage.cached_input_tokens,
                    reasoning_tokens=usage.reasoning_tokens,
                    purpose=request.purpose,
                    attempt=attempt,
                    cache_write_tokens=usage.cache_write_tokens,
                    cache_write_1h_tokens=usage.cache_write_1h_tokens,
                )
            )


def _retry_delay(settings: RunSettings, attempt: int, exc: ModelError) -> float | None:
    """How long to wait before retrying ``exc``, or ``None`` to give up now.

    The provider's ``Retry-After`` wins when it asks for longer than the backoff; asking for
    more than ``model_retry_max_delay_s`` means the limit will not lift soon, so the call fails
    rather than stall the run. The exponential backoff is capped at the same limit and jittered
    so that concurrent leaves hitting the same limit do not retry in lockstep.
    """
    cap = settings.model_retry_max_delay_s
    backoff = min(cap, settings.retry_backoff_s * 2.0 ** (attempt - 1))
    backoff *= random.uniform(0.5, 1.0)
    if exc.retry_after is None:
        return backoff
    if exc.retry_after > cap:
        return None
    return max(backoff, exc.retry_after)
