"""A node's model and tool calls: the one place each call is counted and recorded.

:class:`AccountedModel` is the innermost wrapper of a node's model. For each attempt of a call
it opens every instrument's :class:`~hierplan.core.instrument.CallScope` (a budget reserves, a
trace starts its span), sends the request, builds the attempt's
:class:`~hierplan.core.calls.CallOutcome` once, ends the scopes with it (the budget settles, the
span ends) and records it on the node (a :class:`~hierplan.records.CallRecord` and a
``model_called`` event). A :class:`~hierplan.models.retry.RetryingModel` around it retries what
may be retried, so every attempt is counted on its own. :class:`PatientModel` around that gives a
call whose retries were all spent on transient errors one more round after a pause, once per
node (``transient_retries``): a burst of faults that outlasts the backoff does not fail the
node, and the round's attempts are counted and budgeted like any other.

:func:`call_tool` is the same for a tool call: every instrument's tool scope around it, then a
:class:`~hierplan.records.ToolCallRecord` and a ``tool_called`` event.
"""

from __future__ import annotations

import time
from collections.abc import AsyncGenerator, Mapping
from contextlib import AsyncExitStack, aclosing
from typing import TYPE_CHECKING, Any

import anyio

from hierplan.core import calls
from hierplan.core.calls import CallOutcome
from hierplan.core.events import ModelCalled, StepRetried, ToolCalled
from hierplan.core.instrument import CallScope
from hierplan.core.settings import RunSettings
from hierplan.errors import HierplanError, ModelError, ToolError, stray_cancellation
from hierplan.models.base import (
    Model,
    ModelRequest,
    ModelResponse,
    StreamItem,
    ToolCall,
    WrappedModel,
    stream_of,
    stream_retried,
)
from hierplan.models.retry import RetryingModel, RetryPolicy
from hierplan.pricing import PicoRates
from hierplan.records import TOOL_TEXT_LIMIT, CallRecord, ToolCallRecord
from hierplan.tools.base import Tool, result_text

if TYPE_CHECKING:
    from hierplan.hierarchy.context import NodeContext


def node_model(node: NodeContext) -> Model:
    """The model a node calls: its base model, wrapped by each instrument's ``wrap_model``,
    counted by :class:`AccountedModel`, its retryable errors retried."""
    base = node.base_model
    for instrument in node.run.instruments:
        base = instrument.wrap_model(base, node)
    accounted = AccountedModel(base, node)
    retrying = RetryingModel(accounted, node.run.retry_policy, accounted.retried)
    if node.run.settings.transient_retries == 0:
        return retrying
    return PatientModel(retrying, accounted)


def retry_policy(settings: RunSettings) -> RetryPolicy:
    """How a run's model calls are retried (its ``model_retries``, ``retry_backoff_s`` and
    ``model_retry_max_delay_s``)."""
    return RetryPolicy(
        settings.model_retries,
        settings.retry_backoff_s,
        settings.model_retry_max_delay_s,
        "model_retry_max_delay_s",
    )


class PatientModel(WrappedModel):
    """A node's retrying model with more rounds of retries, each after a pause, for calls whose
    retries were all spent on transient errors (see the module docstring).

    A :class:`~hierplan.errors.ModelError` that leaves the retrying model still ``retryable``
    is one whose retries ran out on errors that may pass (rate limits, server errors, timeouts,
    unreadable replies); a provider asking to wait longer than ``model_retry_max_delay_s`` is
    not, so it is not asked again here either. The node's record counts the rounds
    (``transient_retries``), at most the run's ``transient_retries`` per node, so that a
    provider that stays down still fails the node soon.
    """

    __slots__ = ("accounted",)

    inner: RetryingModel

    def __init__(self, inner: RetryingModel, accounted: AccountedModel) -> None:
        self.inner = inner
        self.accounted = accounted

    async def request(self, request: ModelRequest) -> ModelResponse:
        """Send ``request`` as the retrying model does; after its retries were all spent on
        transient errors, pause and send it again while the node has rounds left."""
        retrying = self.inner
        attempt = 0
        while True:
            attempt += 1
            try:
                # The retrying model's loop, run in this frame rather than awaited: a waiting
                # leaf keeps one coroutine fewer alive (benchmarks/memory.py).
                return await retrying.inner.request(request)
            except ModelError as exc:
                try:
                    delay = retrying.delay_after(attempt, exc)
                except ModelError as spent:
                    delay, attempt = self._pause(spent), 0  # a new round: its own retries
            await anyio.sleep(delay)

    def stream(self, request: ModelRequest) -> AsyncGenerator[StreamItem, None]:
        """Stream ``request`` through the retrying model, with rounds after a pause as
        :meth:`request` has, for failures before the first delta (after it, the reader has
        acted on the text: the error stands)."""
        return stream_retried(self.inner, request, lambda _attempt, exc: self._pause(exc))

    def _pause(self, exc: ModelError) -> float:
        """The pause before one more round after ``exc``, counted on the node; raises ``exc``
        when it gets none."""
        node = self.accounted.node
        settings = node.run.settings
        record = node.record
        if not exc.retryable or record.transient_retries >= settings.transient_retries:
            raise exc
        if (exc.retry_after or 0.0) > settings.model_retry_max_delay_s:
            raise exc  # the limit will not lift soon: as between retries, no waiting
        # The provider's own wait, when longer, is honoured here as between retries.
        pause = max(settings.transient_pause_s, exc.retry_after or 0.0)
        record.transient_retries += 1
        self.accounted.retried(
            self.accounted.attempt,
            ModelError(f"{exc} (retries spent; one more round after a pause)"),
            pause,
        )
        return pause


class AccountedModel(WrappedModel):
    """A node's model with every attempt of every call counted once (see the module
    docstring). Attempts are numbered by request: the retry wrapper sends the same request
    object again, a new call sends a new one (a node's calls are made one at a time)."""

    __slots__ = ("_last", "attempt", "node")

    def __init__(self, inner: Model, node: NodeContext) -> None:
        self.inner = inner
        self.node = node
        self._last: ModelRequest | None = None
        self.attempt = 0

    def retried(self, attempt: int, exc: ModelError, delay: float) -> None:
        """Report a retry of the node's call (a ``step_retried`` event)."""
        node = self.node
        bus = node.run.bus
        if bus.wants("step_retried"):
            bus.emit(
                StepRetried(
                    run_id=bus.run_id,
                    path=node.path,
                    attempt=attempt,
                    error=str(exc),
                    delay_s=delay,
                )
            )

    async def request(self, request: ModelRequest) -> ModelResponse:
        """One attempt: scopes, the call, its outcome, the record (see the module docstring)."""
        started, t0 = time.time(), time.perf_counter()
        sent, estimate, scopes = await self._open(request)
        rates = self.node.run.pricing.rates(self.node.base_model.priced_as)
        try:
            response = await self.inner.request(sent)
        except BaseException as exc:
            outcome = self._failure(sent, estimate, exc, rates)
        else:
            outcome = calls.answered(sent, estimate, response, rates)
        await _settle(self, scopes, outcome, started, t0)
        return self._result(outcome)

    async def stream(self, request: ModelRequest) -> AsyncGenerator[StreamItem, None]:
        """One attempt, streamed: as :meth:`request`, the deltas passed on as they come. A
        stream closed or cancelled before its end counts for the text it wrote by then
        (:func:`~hierplan.core.calls.stream_cut`): its reservation is settled at that."""
        started, t0 = time.time(), time.perf_counter()
        sent, estimate, scopes = await self._open(request)
        rates = self.node.run.pricing.rates(self.node.base_model.priced_as)
        written: list[str] = []
        response: ModelResponse | None = None
        try:
            async with aclosing(stream_of(self.inner, sent)) as items:
                async for item in items:
                    if isinstance(item, ModelResponse):
                        response = item
                    else:
                        written.append(item)
                        yield item
        except GeneratorExit:
            # The reader closed the stream (a step it refused): settle what was written, then
            # let the generator close. Shielded: the reader may be closing it while cancelled.
            outcome = calls.stream_cut(sent, estimate, "".join(written), None, rates)
            with anyio.CancelScope(shield=True):
                await _settle(self, scopes, outcome, started, t0)
            raise
        except BaseException as exc:
            if isinstance(exc, anyio.get_cancelled_exc_class()):
                outcome = calls.stream_cut(sent, estimate, "".join(written), exc, rates)
            else:
                outcome = self._failure(sent, estimate, exc, rates)
        else:
            if response is None:
                error = ModelError(f"model {self.inner.name!r} ended its stream with no answer")
                outcome = calls.failed(sent, estimate, error, rates)
            else:
                outcome = calls.answered(sent, estimate, response, rates)
        await _settle(self, scopes, outcome, started, t0)
        yield self._result(outcome)

    async def _open(self, request: ModelRequest) -> tuple[ModelRequest, int, list[CallScope]]:
        """Number the attempt and open every instrument's call scope: the request as the scopes
        let it go out (a budget may lower its ``max_tokens``), its input estimate, the scopes."""
        self.attempt = self.attempt + 1 if request is self._last else 1
        self._last = request
        node = self.node
        estimate = node.count_input(request)
        scopes: list[CallScope] = []
        sent = request
        try:
            for instrument in node.run.instruments:
                scope = instrument.call_scope(node, request)
                if scope is not None:
                    scopes.append(scope)  # ended even if it fails to start: it may hold
                    sent = await scope.start(sent, estimate)
        except BaseException as exc:
            # Refused before it went out (a budget), or cancelled while a scope waited.
            await _settle(self, scopes, calls.not_made(sent, exc), 0.0, 0.0)  # not recorded
            raise
        return sent, estimate, scopes

    def _result(self, outcome: CallOutcome) -> ModelResponse:
        """The response of an outcome that answered; raises the error of one that did not."""
        error = outcome.error
        if error is None:
            assert outcome.response is not None
            return outcome.response
        if isinstance(error, anyio.get_cancelled_exc_class()) and stray_cancellation():
            raise ModelError(
                f"model {self.node.base_model.name!r} raised {type(error).__name__} though "
                "nothing cancelled the call"
            ) from error
        raise error

    def _failure(
        self, request: ModelRequest, estimate: int, exc: BaseException, rates: PicoRates | None
    ) -> CallOutcome:
        """What a call that raised ``exc`` counts for (a cut, a failure, or no call at all)."""
        if isinstance(exc, anyio.get_cancelled_exc_class()):
            return calls.cut_short(request, estimate, exc, rates)
        if isinstance(exc, ModelError):
            return calls.failed(request, estimate, exc, rates)
        if isinstance(exc, HierplanError) or not isinstance(exc, Exception):
            # A test double's own error, or an interrupt (Ctrl-C): no call to count.
            return calls.not_made(request, exc)
        # A user's function raising ValueError, a connection's OSError: a failed call, as
        # transient as a provider's server error when it is an OSError.
        error = ModelError(
            f"model {self.node.base_model.name!r} raised {type(exc).__name__}: {exc}",
            retryable=isinstance(exc, OSError),
        )
        error.__cause__ = exc
        return calls.failed(request, estimate, error, rates)

    def _record(self, outcome: CallOutcome, started: float, duration: float) -> None:
        if not outcome.made:
            return
        node = self.node
        request = outcome.request
        usage = outcome.usage or calls.NO_USAGE
        name = outcome.model_name or self.inner.name
        node.record.add_call(
            CallRecord(
                request.phase,
                name,
                request.purpose,
                usage,
                outcome.cost_pico,
                started,
                duration,
                self.attempt,
                outcome.ok,
                outcome.flags,
            )
        )
        bus = node.run.bus
        if bus.wants("model_called"):
            bus.emit(
                ModelCalled(
                    run_id=bus.run_id,
                    path=node.path,
                    model=self.inner.name,
                    phase=request.phase,
                    input_tokens=usage.input_tokens,
                    output_tokens=usage.output_tokens,
                    cost_usd=None if outcome.cost_pico is None else outcome.cost_pico / 10**12,
                    duration_s=duration,
                    ok=outcome.ok,
                    cached_input_tokens=usage.cached_input_tokens,
                    reasoning_tokens=usage.reasoning_tokens,
                    purpose=request.purpose,
                    attempt=self.attempt,
                    cache_write_tokens=usage.cache_write_tokens,
                    cache_write_1h_tokens=usage.cache_write_1h_tokens,
                )
            )


async def _settle(
    model: AccountedModel,
    scopes: list[CallScope],
    outcome: CallOutcome,
    started: float,
    t0: float,
) -> None:
    """End an attempt of ``model``: its scopes end with its outcome in reverse order (a budget
    settles, a span ends), then it is recorded on the node (when it was made), timed from
    ``t0`` (``perf_counter``), ``started`` the wall-clock time it began. The scopes end
    shielded when the call was cancelled, since a budget must still settle what it held (a
    ledger that waits for I/O would be cancelled at once). A function rather than a method,
    and one coroutine for both: it is on every call's path (benchmarks/instructions.py)."""
    if scopes:
        error = outcome.error
        if error is not None and isinstance(error, anyio.get_cancelled_exc_class()):
            with anyio.CancelScope(shield=True):
                for scope in reversed(scopes):
                    await scope.end(outcome)
        else:
            for scope in reversed(scopes):
                await scope.end(outcome)
    model._record(outcome, started, time.perf_counter() - t0)


async def call_tool(
    node: NodeContext,
    target: Tool,
    arguments: Mapping[str, Any],
    call_id: str,
    *,
    references: bool = False,
    planned: Mapping[str, Any] | None = None,
) -> Any:
    """Call a tool inside every instrument's tool scope, record it on the node and report a
    ``tool_called`` event (``references``: the arguments hold outputs of earlier steps, see
    :meth:`~hierplan.tools.base.Tool.call`; ``planned``: the plan's arguments they were made
    from, whose schema check at the plan gate is not made again)."""
    run = node.run
    checked = planned is not None and run.toolbox.take_checked(target.name, planned)
    # The text of the arguments as the tool gets them: a tool may change what it is given.
    arguments_text = result_text(arguments, limit=TOOL_TEXT_LIMIT)
    started_at = time.time()
    started = time.perf_counter()
    error: str | None = None
    output: Any = None
    try:
        call = ToolCall(call_id, target.name, arguments)
        scopes = [
            scope
            for instrument in run.instruments
            if (scope := instrument.tool_scope(node, call)) is not None
        ]
        if not scopes:  # the usual case without tracing: no exit stack to build and unwind
            output = await _call(target, arguments, references=references, checked=checked)
            return output
        async with AsyncExitStack() as stack:
            for scope in scopes:
                await stack.enter_async_context(scope)
            output = await _call(target, arguments, references=references, checked=checked)
        return output
    except HierplanError as exc:
        error = str(exc)
        raise
    except anyio.get_cancelled_exc_class() as exc:
        if stray_cancellation():
            error = f"tool {target.name!r} raised {type(exc).__name__} though nothing cancelled it"
            raise ToolError(error, retryable=False) from exc
        # A step's deadline or a cancelled run stopped the call: it did not succeed.
        error = "cancelled before it finished"
        raise
    finally:
        duration = time.perf_counter() - started
        node.record.tool_calls.append(
            ToolCallRecord(
                tool=target.name,
                arguments=arguments_text,
                result=None if error is not None else result_text(output, limit=TOOL_TEXT_LIMIT),
                error=error,
                started_at=started_at,
                duration_s=duration,
            )
        )
        if run.bus.wants("tool_called"):
            run.bus.emit(
                ToolCalled(
                    run_id=run.run_id,
                    path=node.path,
                    tool=target.name,
                    call_id=call_id,
                    ok=error is None,
                    duration_s=duration,
                    error=error,
                )
            )


async def _call(
    target: Tool, arguments: Mapping[str, Any], *, references: bool, checked: bool
) -> Any:
    try:
        return await target.call(arguments, references=references, checked=checked)
    except HierplanError:
        raise
    # A tool's own bug or failure becomes a step failure; so does a sys.exit() in its code (an
    # argparse or click command line refusing its arguments), which would end the whole run.
    except (Exception, SystemExit) as exc:
        raise ToolError(f"tool {target.name!r} failed: {type(exc).__name__}: {exc}") from exc
