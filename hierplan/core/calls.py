"""One model call as everything downstream counts it: a :class:`CallOutcome`.

Each attempt of a model call produces one outcome, built here once: the usage it counts for,
its flags, and its cost in whole pico-dollars. The run record, the budget and the trace all
take their figures from it, so they cannot disagree.

How a call counts:

- answered: the usage the provider reported; a reply without usage at the request's worst case
  (flag ``no_usage``), impossible usage as the nearest possible one (``invalid_usage``);
- failed: the usage the error reported; the worst case when the provider may have billed it
  without saying (``no_usage``, a timeout say); nothing when it used nothing (flag ``failed``);
- cut short (cancelled, a deadline): the worst case, since the provider may have billed it
  (flag ``cut_short``);
- a stream closed or cancelled before its end: its estimated input and the output its text so
  far counts for (at most ``max_tokens``; flags ``cut_short`` and ``stream_closed``), since a
  stream stops the model writing when it is closed;
- not made (a budget refused it, or it was cancelled before the request went out): no usage
  and ``made`` false; the record does not list it.

The worst case is the request's estimated input (with what the provider adds on its own, see
:func:`~hierplan.models.tokens.estimate_input_tokens`) plus its ``max_tokens``, as sent: what
a budget reserved for it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from hierplan.errors import ModelError
from hierplan.models.base import ModelRequest, ModelResponse
from hierplan.models.tokens import estimate_text_tokens
from hierplan.pricing import PicoRates
from hierplan.units import Usage

NO_USAGE = Usage()
"""The usage of a call that used nothing."""


@dataclass(slots=True)
class CallOutcome:
    """One attempt of a model call, counted once (see the module docstring).

    ``usage`` is ``None`` when the call used nothing; ``cost_pico`` is ``None`` when the model
    has no price (or the call used nothing). ``flags`` may be added to by the instruments that
    see the outcome first (a budget adds ``overrun``), before the record takes it.
    """

    request: ModelRequest
    input_estimate: int
    usage: Usage | None = None
    cost_pico: int | None = None
    flags: list[str] = field(default_factory=list)
    ok: bool = False
    made: bool = True
    model_name: str = ""
    response: ModelResponse | None = None
    error: BaseException | None = None

    @property
    def worst_case(self) -> Usage:
        """The most the request could use: its estimated input plus its ``max_tokens``."""
        return Usage(self.input_estimate, self.request.max_tokens)


def _priced(outcome: CallOutcome, rates: PicoRates | None) -> CallOutcome:
    if outcome.usage is not None and rates is not None:
        outcome.cost_pico = rates.cost(outcome.usage)
    return outcome


def _possible(usage: Usage, flags: list[str]) -> Usage:
    possible = usage.possible()
    if possible is not usage and "invalid_usage" not in flags:
        flags.append("invalid_usage")
    return possible


def answered(
    request: ModelRequest, estimate: int, response: ModelResponse, rates: PicoRates | None
) -> CallOutcome:
    """The outcome of a call that answered. The response's ``usage`` and ``flags`` are set to
    what it counts for, so that whoever reads the reply later sees the same figures."""
    flags = response.flags
    if response.usage is None:
        usage = Usage(estimate, request.max_tokens)
        if "no_usage" not in flags:
            flags.append("no_usage")
    else:
        usage = _possible(response.usage, flags)
    response.usage = usage
    outcome = CallOutcome(
        request, estimate, usage, flags=list(flags), ok=True, model_name=response.model
    )
    outcome.response = response
    return _priced(outcome, rates)


def failed(
    request: ModelRequest, estimate: int, error: ModelError, rates: PicoRates | None
) -> CallOutcome:
    """The outcome of a call that failed with ``error``; the error's ``usage`` is set to what it
    counts for."""
    flags: list[str] = []
    usage: Usage | None
    if error.usage is None:
        usage = Usage(estimate, request.max_tokens) if error.unknown_usage else None
        if usage is not None:
            flags.append("no_usage")
    else:
        usage = _possible(error.usage, flags)
        if error.unknown_usage and not flags:
            flags.append("no_usage")
    error.usage = usage
    flags.append("failed")
    return _priced(CallOutcome(request, estimate, usage, flags=flags, error=error), rates)


def cut_short(
    request: ModelRequest, estimate: int, error: BaseException, rates: PicoRates | None
) -> CallOutcome:
    """The outcome of a call cut short (cancelled, a deadline): counted at its worst case."""
    usage = Usage(estimate, request.max_tokens)
    return _priced(CallOutcome(request, estimate, usage, flags=["cut_short"], error=error), rates)


def stream_cut(
    request: ModelRequest,
    estimate: int,
    text: str,
    error: BaseException | None,
    rates: PicoRates | None,
) -> CallOutcome:
    """The outcome of a stream closed (``error`` ``None``: its reader stopped reading) or
    cancelled before its end: counted at the output its ``text`` so far estimates."""
    output = min(request.max_tokens, estimate_text_tokens(text))
    usage = Usage(estimate, output)
    flags = ["cut_short", "stream_closed"]
    return _priced(CallOutcome(request, estimate, usage, flags=flags, error=error), rates)


def not_made(request: ModelRequest, error: BaseException) -> CallOutcome:
    """The outcome of a call that never went out (a budget refused it)."""
    return CallOutcome(request, 0, None, flags=["not_made"], made=False, error=error)
