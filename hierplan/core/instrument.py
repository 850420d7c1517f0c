"""The instrument protocol: how budgets, tracing and a user's own wrappers plug into a run.

An :class:`Instrument` may open a scope around the run, each node, each planning round and each
tool call, and a :class:`CallScope` around each model call (each attempt): the scope may lower
the request's ``max_tokens`` or refuse it before it goes out, and gets the call's
:class:`~hierplan.core.calls.CallOutcome` after. Scopes an instrument does not need are
``None``, so an unused hook costs one method call. Instruments see the run only through
:class:`~hierplan.core.views.RunView` and :class:`~hierplan.core.views.NodeView`; providers and
strategies know nothing of them.
"""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import AbstractAsyncContextManager, AsyncExitStack
from typing import Any

from hierplan.core.calls import CallOutcome
from hierplan.core.spend import Funds
from hierplan.core.views import NodeView, RunView
from hierplan.models.base import Model, ModelRequest, ToolCall


class CallScope:
    """One model call (one attempt) as an instrument sees it. Scopes start in the order of the
    run's instruments and end in the reverse order: a scope may add flags to the outcome for
    the scopes that end after it and for the record."""

    async def start(self, request: ModelRequest, estimate: int) -> ModelRequest:
        """Before the call: return the request to send (``max_tokens`` lowered, say), or raise
        to refuse it (:class:`~hierplan.errors.BudgetExceeded`). ``estimate`` is the request's
        estimated input tokens."""
        return request

    async def end(self, outcome: CallOutcome) -> None:
        """After the call (also when it failed, was cut short, or was refused by a scope that
        started later): what it counts for."""


class Instrument:
    """Base class for budgets, tracing and other wrappers; override only what you need."""

    def wrap_model(self, model: Model, node: NodeView) -> Model:
        """Return the model ``node`` should call (wrapped, or as is)."""
        return model

    def run_scope(self, run: RunView) -> AbstractAsyncContextManager[None] | None:
        """A scope around the whole run, or ``None``."""
        return None

    def node_scope(self, node: NodeView) -> AbstractAsyncContextManager[None] | None:
        """A scope around one node's whole life, or ``None``."""
        return None

    def planning_scope(
        self, node: NodeView, reason: str
    ) -> AbstractAsyncContextManager[None] | None:
        """A scope around one planning round (the planning model calls), or ``None``."""
        return None

    def tool_scope(
        self, node: NodeView, call: ToolCall
    ) -> AbstractAsyncContextManager[None] | None:
        """A scope around one tool call, or ``None``."""
        return None

    def call_scope(self, node: NodeView, request: ModelRequest) -> CallScope | None:
        """A scope around one attempt of a model call of ``node``, or ``None``."""
        return None

    async def funds(self, node: NodeView) -> Funds | None:
        """What ``node`` may still spend under this instrument (a budget's), or ``None`` when
        it sets no limit: what its planner is told and its plans are checked against."""
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
