"""Typed run events: what happened, in causal order per node.

Events are pydantic models (JSON-serialisable). They are built only when someone listens: the
hot path asks :meth:`EventBus.wants` first, so a run without listeners pays nothing, and an
event type no listener takes (a listener's ``event_types``) is not built either.
Listeners are called synchronously, on the event loop's thread, in the order events happen; a
listener must not block (:class:`hierplan.RunHandle` buffers them for async consumers).

The events of a run, in order: :class:`RunStarted`; then per node :class:`NodeStarted`, its
plans (:class:`PlanProposed`, then :class:`PlanDecided`: approved, edited, rejected or
invalid; :class:`Replanned` with the diff when a failure changed the plan), its model calls
(:class:`ModelCalled`, with usage and cost) and tool calls (:class:`ToolCalled`), retries
(:class:`StepRetried`), under a budget each call's reservation (:class:`BudgetReserved`,
before the call) and settlement (:class:`BudgetSettled`, after it; :class:`BudgetOverrun`
when it used more) or the refusal of a call that does not fit (:class:`BudgetExhausted`), its
children, and :class:`NodeFinished`; last :class:`RunFinished`.
:func:`parse_event` reads any of them back from JSON.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Annotated, Any, Literal, get_args

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter

from hierplan.errors import UserInputError

# Named, not __name__: users configure the package's one logger.
_log = logging.getLogger("hierplan")


class RunEvent(BaseModel):
    """Base of every event: the run, the node path and when."""

    model_config = ConfigDict(frozen=True)

    type: str
    run_id: str = ""
    path: str = ""
    at: float = Field(default_factory=time.time)


class RunStarted(RunEvent):
    """A run started: its goal, strategy, models and settings."""

    type: Literal["run_started"] = "run_started"
    goal: str
    strategy: str
    model: str
    settings: dict[str, Any] = Field(default_factory=dict)


class NodeStarted(RunEvent):
    """A planner or executor node started.

    Under a budget, ``limit_tokens`` and ``limit_usd`` are the node's allocation: what it was
    granted and may spend (the run's budget at the root, its share of its planner's below; an
    on-demand node's cap on what it may draw). ``None`` in a dimension that is unlimited (or
    untracked, for USD), and without a budget.
    """

    type: Literal["node_started"] = "node_started"
    kind: str
    goal: str
    step_id: str | None = None
    limit_tokens: int | None = None
    limit_usd: float | None = None


class NodeFinished(RunEvent):
    """A node finished with a status; cost is the node's own, subtree cost includes children."""

    type: Literal["node_finished"] = "node_finished"
    status: str
    cost_usd: float = 0.0
    subtree_cost_usd: float = 0.0
    error: str | None = None


class PlanProposed(RunEvent):
    """A planner proposed a plan version."""

    type: Literal["plan_proposed"] = "plan_proposed"
    version: int
    reason: str
    plan: dict[str, Any]


class PlanDecided(RunEvent):
    """The gate decided on a plan version: approved, edited, rejected or invalid."""

    type: Literal["plan_decided"] = "plan_decided"
    version: int
    decision: str
    decided_by: str
    note: str = ""
    problems: list[str] = Field(default_factory=list)


class Replanned(RunEvent):
    """A node revised its plan after a failure or new information."""

    type: Literal["replanned"] = "replanned"
    version: int
    reason: str
    diff: str
    added: list[str] = Field(default_factory=list)
    removed: list[str] = Field(default_factory=list)
    changed: list[str] = Field(default_factory=list)


class StepRetried(RunEvent):
    """A step (or model call) failed and will be tried again."""

    type: Literal["step_retried"] = "step_retried"
    attempt: int
    error: str
    delay_s: float


class ToolCalled(RunEvent):
    """A tool was called."""

    type: Literal["tool_called"] = "tool_called"
    tool: str
    call_id: str
    ok: bool
    duration_s: float
    error: str | None = None


class ModelCalled(RunEvent):
    """A model call finished (one attempt)."""

    type: Literal["model_called"] = "model_called"
    model: str
    phase: str
    input_tokens: int
    output_tokens: int
    cost_usd: float | None
    duration_s: float
    ok: bool = True
    cached_input_tokens: int = 0
    reasoning_tokens: int = 0
    purpose: str = ""
    attempt: int = 1
    cache_write_tokens: int = 0
    cache_write_1h_tokens: int = 0


class BudgetReserved(RunEvent):
    """A model call's worst case was reserved from the node's budget before the call.

    ``max_tokens`` is what the call may produce; ``requested_max_tokens`` is what was asked for
    (larger when the budget lowered it). ``usd`` is ``None`` when USD is not tracked.
    """

    type: Literal["budget_reserved"] = "budget_reserved"
    phase: str
    tokens: int
    usd: float | None
    max_tokens: int
    requested_max_tokens: int


class BudgetSettled(RunEvent):
    """A reservation was settled at the call's actual usage; the rest went back.

    ``flags`` says what was unusual: ``no_usage`` (settled at the reserved worst case: a reply
    without usage, or a failure the provider may have billed without saying how much, such as
    a timeout), ``overrun`` (usage above the reservation), ``failed`` (the call failed, its
    usage counts), ``cut_short`` (cancelled or past a deadline before the reply came: settled
    at the reservation, since the provider may have billed it), ``released`` (nothing used:
    the call failed before the provider took it, or without usage).

    The account the call was charged to (the node's, or its nearest budgeted ancestor's), just
    after the settlement: ``spent_*`` (what it has spent: its own calls, its closed children's
    and its on-demand children's), ``held_*`` (what it holds now for calls in flight) and
    ``remaining_*`` (what it could reserve now; ``None`` where unlimited). USD figures are
    ``None`` when USD is not tracked.
    """

    type: Literal["budget_settled"] = "budget_settled"
    phase: str
    tokens: int
    usd: float | None
    reserved_tokens: int
    reserved_usd: float | None
    flags: list[str] = Field(default_factory=list)
    spent_tokens: int | None = None
    spent_usd: float | None = None
    held_tokens: int | None = None
    held_usd: float | None = None
    remaining_tokens: int | None = None
    remaining_usd: float | None = None


class BudgetExhausted(RunEvent):
    """A call did not fit the node's budget, even with ``max_tokens`` at its floor; it was not
    made. ``needed_*`` is the smallest reservation the call could have had."""

    type: Literal["budget_exhausted"] = "budget_exhausted"
    phase: str
    needed_tokens: int
    needed_usd: float | None
    available_tokens: int | None
    available_usd: float | None


class BudgetOverrun(RunEvent):
    """A call used more than was reserved for it (charged all the same, and flagged)."""

    type: Literal["budget_overrun"] = "budget_overrun"
    phase: str
    tokens_over: int
    usd_over: float | None


class RunFinished(RunEvent):
    """The run finished. ``reason`` says why a ``skipped`` run did not start (``budget``)."""

    type: Literal["run_finished"] = "run_finished"
    status: str
    cost_usd: float
    answer: str
    input_tokens: int = 0
    output_tokens: int = 0
    error: str | None = None
    reason: str | None = None


AnyEvent = Annotated[
    RunStarted
    | NodeStarted
    | NodeFinished
    | PlanProposed
    | PlanDecided
    | Replanned
    | StepRetried
    | ToolCalled
    | ModelCalled
    | BudgetReserved
    | BudgetSettled
    | BudgetExhausted
    | BudgetOverrun
    | RunFinished,
    Field(discriminator="type"),
]
"""Every event type, discriminated by ``type`` (for reading events back)."""

_EVENT_ADAPTER: TypeAdapter[AnyEvent] = TypeAdapter(AnyEvent)

EVENT_TYPES: frozenset[str] = frozenset(
    event.model_fields["type"].default for event in get_args(get_args(AnyEvent)[0])
)
"""The ``type`` of every event a run emits."""


def parse_event(data: str | bytes | dict[str, Any]) -> RunEvent:
    """An event from its JSON text (``event.model_dump_json()``) or its dict.

    >>> parse_event('{"type": "node_started", "path": "1", "kind": "planner", "goal": "g"}').kind
    'planner'
    """
    if isinstance(data, dict):
        return _EVENT_ADAPTER.validate_python(data)
    return _EVENT_ADAPTER.validate_json(data)


Listener = Callable[[RunEvent], None]
"""A function a run calls with each of its events (``listeners=``), on the event loop's thread."""


class EventBus:
    """Delivers events to listeners in the order they are emitted.

    A listener may name event types it ignores; an event type that every listener ignores is
    not built at all (see :meth:`wants`), which matters for the per-leaf events.
    """

    def __init__(self, run_id: str = "") -> None:
        self.run_id = run_id
        self._listeners: list[tuple[Listener, frozenset[str]]] = []
        self._ignored_by_all: frozenset[str] = frozenset()

    @property
    def active(self) -> bool:
        """Whether anyone listens (build events only then)."""
        return bool(self._listeners)

    def wants(self, event_type: str) -> bool:
        """Whether some listener takes events of ``event_type`` (build that event only then)."""
        return bool(self._listeners) and event_type not in self._ignored_by_all

    def subscribe(
        self, listener: Listener, *, ignore: frozenset[str] = frozenset()
    ) -> Callable[[], None]:
        """Add a listener, which is not sent events of the ``ignore`` types, nor of any type
        its ``event_types`` leaves out (see :func:`ignored_by`); the returned function
        removes it."""
        entry = (listener, ignore | ignored_by(listener))
        # The list is replaced, never changed in place: an emit under way (a listener that
        # unsubscribes, or subscribes another) goes on over the listeners it started with.
        self._listeners = [*self._listeners, entry]
        self._update()

        def unsubscribe() -> None:
            self._listeners = [e for e in self._listeners if e is not entry]
            self._update()

        return unsubscribe

    def _update(self) -> None:
        ignored = [ignore for _, ignore in self._listeners]
        self._ignored_by_all = frozenset.intersection(*ignored) if ignored else frozenset()

    def emit(self, event: RunEvent) -> None:
        """Send ``event`` to every listener that does not ignore its type.

        A listener that raises an :class:`Exception` is logged (on the ``hierplan`` logger,
        with its traceback) and the other listeners and the run go on: a bug in a progress
        display must not fail a run that may have cost money. ``KeyboardInterrupt`` and
        cancellation still propagate.
        """
        for listener, ignore in self._listeners:
            if event.type not in ignore:
                try:
                    listener(event)
                except Exception:
                    _log.exception(
                        "event listener %s raised on a %s event; the run goes on",
                        _listener_name(listener),
                        event.type,
                    )


def ignored_by(listener: Listener) -> frozenset[str]:
    """The event types ``listener`` is not sent: every type but those its ``event_types``
    attribute names, if it has one (a display that shows a few kinds of event), else none.

    Raises :class:`~hierplan.errors.UserInputError` when ``event_types`` names a type no run
    emits: a typo would otherwise silence the listener."""
    wanted = getattr(listener, "event_types", None)
    if wanted is None:
        return frozenset()
    names = frozenset([wanted] if isinstance(wanted, str) else wanted)
    unknown = names - EVENT_TYPES
    if unknown:
        raise UserInputError(
            f"listener {_listener_name(listener)} has event_types that no run emits: "
            f"{', '.join(sorted(map(repr, unknown)))}; the event types are "
            f"{', '.join(sorted(EVENT_TYPES))}"
        )
    return EVENT_TYPES - names


def _listener_name(listener: Listener) -> str:
    """A listener's name for a log line: its qualified name, else its ``repr``."""
    name = getattr(listener, "__qualname__", None)
    if isinstance(name, str):
        module = getattr(listener, "__module__", None)
        return f"{module}.{name}" if isinstance(module, str) else name
    return repr(listener)
