"""Exceptions raised by hierplan.

The hierarchy::

    HierplanError
    ├── UserInputError            bad input from a user: goal files, plan files, options
    │   ├── UnknownScenarioError
    │   ├── ModelNotAvailableError    a model string names a provider that is not available
    │   └── DuplicateToolError        two tools of a run share a name (also a ValueError)
    ├── PlanValidationError       a plan failed validation; ``problems`` lists every finding
    ├── PlanParseError            model output that is not a plan, even after a repair attempt
    ├── StepFailed                a step or node failed for good; ``status`` says how
    ├── SimulatorCoverageError    the offline simulator was asked about something no oracle knows
    ├── BudgetExceeded            a call did not fit the node's budget and was not made
    ├── RunSkipped                the run did not start (its budget could not be granted)
    ├── ModelError                a model call failed (provider errors are wrapped in it)
    │   ├── ModelAuthError        the provider refused the credentials (401/403): the run stops
    │   └── UnexpectedModelCall   a ScriptedModel was called past its script
    └── ToolError                 a tool failed (retried unless raised with retryable=False)
        ├── ToolArgsError         a tool was called with invalid arguments (not retried)
        ├── ToolTimeoutError      a tool ran past its timeout (retried)
        ├── ToolNotAllowedError   a tool outside the node's allowlist was requested
        ├── ToolBlocked           a call needs work not done yet (run again after the plan)
        └── ToolServerGone        the server behind a tool (an MCP server) died (not retried)

Errors that a user can fix carry a message saying what was wrong and what to do; the CLI prints
that message on one line and exits with status 2.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING

import anyio

from hierplan.text import printable

if TYPE_CHECKING:
    from pydantic import ValidationError

    from hierplan.units import Usage


# The most field problems one error message lists: a file of thousands of bad steps would
# otherwise make one line of hundreds of kilobytes, where the first few say what to fix.
MAX_LISTED_PROBLEMS = 10


def field_problems(exc: ValidationError, whole: str) -> str:
    """The fields a validation error found wrong, as ``loc: msg`` joined by ``; `` (``whole``
    names the data itself), at most :data:`MAX_LISTED_PROBLEMS` of them and how many more.
    Printable (:func:`hierplan.text.printable`): a field's name is the input's, and may hold
    anything."""
    errors = exc.errors()
    listed = "; ".join(
        f"{_where(err['loc'], whole)}: {err['msg']}" for err in errors[:MAX_LISTED_PROBLEMS]
    )
    more = len(errors) - MAX_LISTED_PROBLEMS
    return printable(f"{listed}; and {more} more" if more > 0 else listed)


def first_problem(exc: ValidationError, whole: str = "top level") -> str:
    """``"<where>: <what>"`` of the first error a pydantic validation found (``whole``: what
    to call the input itself when the error is about all of it), printable."""
    first = exc.errors()[0]
    return printable(f"{_where(first['loc'], whole)}: {first['msg']}")


def _where(loc: Sequence[int | str], whole: str, limit: int = 100) -> str:
    """A field's location, ``steps.0.title``, cut to ``limit`` characters: an unknown key is
    named as the input spells it, at any length."""
    where = ".".join(str(p) for p in loc) or whole
    return where if len(where) <= limit else where[: limit - 3] + "..."


def is_positive_seconds(value: object) -> bool:
    """Whether ``value`` is a number of seconds a deadline can be: more than 0, ``math.inf``
    for none; ``not > 0`` also refuses NaN, which would end every wait at once."""
    return not isinstance(value, bool) and isinstance(value, int | float) and value > 0


class HierplanError(Exception):
    """Base class of every exception hierplan raises on purpose."""


class UserInputError(HierplanError):
    """Input from the user (a file, an option, a goal) is wrong; the message says how to fix it."""


class UnknownScenarioError(UserInputError):
    """The named scenario does not exist."""


class ModelNotAvailableError(UserInputError):
    """A model string names a provider or model that cannot be used here."""


class DuplicateToolError(UserInputError, ValueError):
    """Two tools of a run have the same name. Also a ``ValueError``, which it was before it
    was a :class:`UserInputError`."""


class PlanValidationError(HierplanError):
    """A plan failed validation. ``problems`` holds every finding, not only the first."""

    def __init__(self, problems: Sequence[object], *, context: str = "plan") -> None:
        self.problems = list(problems)
        lines = "; ".join(str(p) for p in self.problems)
        super().__init__(f"{context} is invalid: {lines}")


class StepFailed(HierplanError):
    """A step (or a whole node) failed for good after its retries.

    ``status`` is the status its node ends with: ``failed``, ``partial``, ``rejected`` or
    ``budget_exhausted``. ``retryable`` says whether trying the same step again may help at
    once; ``blocked``, whether it may help once the rest of its plan has run (its tool raised
    :class:`ToolBlocked`).
    """

    def __init__(
        self,
        message: str,
        *,
        status: str = "failed",
        retryable: bool = False,
        blocked: bool = False,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.retryable = retryable
        self.blocked = blocked


class PlanParseError(HierplanError):
    """A model produced output that could not be turned into a valid plan."""


class SimulatorCoverageError(HierplanError):
    """The simulator has no oracle for the request; it never invents an answer."""


class ModelError(HierplanError):
    """A model call failed.

    ``retryable`` says whether the same call may succeed later (rate limits, overload, server
    errors, timeouts); ``retry_after`` is the provider's hint in seconds; ``usage`` is what the
    failed attempt consumed, when known, so that budgets count it. ``unknown_usage`` says that
    the request reached the provider, which may have billed it, and that no usage came back
    (an attempt that timed out waiting for the reply, a connection lost after sending): such an
    attempt counts at its worst case, as a reply without usage does, never as free.
    """

    def __init__(
        self,
        message: str,
        *,
        retryable: bool = False,
        retry_after: float | None = None,
        usage: Usage | None = None,
        unknown_usage: bool = False,
    ) -> None:
        super().__init__(message)
        self.retryable: bool = retryable
        self.retry_after: float | None = retry_after
        self.usage: Usage | None = usage
        self.unknown_usage: bool = unknown_usage


class ModelAuthError(ModelError):
    """The provider refused the API key or the account (HTTP 401 or 403).

    No later call of the run can succeed either, so the run stops with the provider's message
    instead of failing one node after another.
    """


class BudgetExceeded(HierplanError):
    """A node cannot reserve what its next model call may cost; the call was not made."""


class BudgetTooSmall(UserInputError):
    """A run's budget cannot pay for its root's first call at the lowest ``max_tokens``
    allowed: nothing was called; the message names the smallest budget that would start."""


class RunSkipped(HierplanError):
    """An instrument's scope around the root node declined to start the run: a budget whose
    parent account could not grant the run's budget, say. Never raised out of a run: the run
    ends with status ``skipped`` and ``reason`` (``budget``), and the message as its error."""

    def __init__(self, message: str, *, reason: str) -> None:
        super().__init__(message)
        self.reason = reason


class UnexpectedModelCall(ModelError):
    """A ScriptedModel received a call its script did not foresee."""


class ToolError(HierplanError):
    """A tool failed. ``retryable`` says whether running it again may help.

    A tool raises it to say which: ``ToolError("rate limited", retryable=True)`` for a
    transient failure, which a plan's tool step retries (up to ``max_retries``);
    ``ToolError("no such table", retryable=False)`` for one that would only fail again, which
    fails the step at once (its planner may replan). Left out, it is the class's own: retried
    for a plain ``ToolError``, as for any other exception a tool raises.
    """

    retryable: bool = True

    def __init__(self, message: str = "", *, retryable: bool | None = None) -> None:
        super().__init__(message)
        if retryable is not None:
            self.retryable = retryable

    def __reduce__(self) -> tuple[object, ...]:
        # Pickled (a step's failure crossing to a worker process) with the flag it was given.
        return (_tool_error, (type(self), str(self), self.retryable))


class ToolArgsError(ToolError):
    """A tool was called with arguments that do not match its schema."""

    retryable = False


class ToolTimeoutError(ToolError):
    """A tool ran past its timeout."""

    retryable = True


class ToolNotAllowedError(ToolError):
    """A tool that is not allowed for this node, or does not exist, was requested."""

    retryable = False


class ToolBlocked(ToolError):
    """A tool call that needs work not done yet: rows whose parent rows are not copied, a table
    not created. Trying again at once would fail again, so the step is not retried then; its
    plan runs it again when every other step that can run has ended (the work it needed may be
    among them): once in any case, and again only while other steps succeed meanwhile."""

    retryable = False


class ToolServerGone(ToolError):
    """The server behind a tool (an MCP server) exited or dropped its connection.

    Every later call of its tools fails at once with this error, so the steps that need them
    fail (and their planners replan) instead of waiting.
    """

    retryable = False


def _tool_error(cls: type[ToolError], message: str, retryable: bool) -> ToolError:
    """Rebuild a pickled :class:`ToolError` (see ``ToolError.__reduce__``)."""
    return cls(message, retryable=retryable)


def stray_cancellation() -> bool:
    """Whether a cancellation exception caught now was raised by the code called (a tool or a
    model awaiting something that someone else cancelled) rather than delivered by a cancel
    scope of this task (a step's deadline, a cancelled run). A task group drops a cancellation
    that leaves a task, so a stray one would end its step silently, with no error: it is made
    a failure of the tool or model instead."""
    return anyio.current_effective_deadline() != -math.inf
