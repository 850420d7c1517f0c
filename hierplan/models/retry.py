"""Retries of a model's retryable errors, as a wrapper around the model.

:class:`RetryingModel` sends the same request again after a :class:`~hierplan.errors.ModelError`
that is ``retryable`` (a rate limit, a server error, a dropped connection), with exponential
backoff, jittered so that concurrent callers hitting one limit do not retry in lockstep, and
capped. A provider's ``Retry-After`` wins when it asks for longer than the backoff; one asking
for more than the cap fails the call at once, since the limit will not lift soon. Each attempt
passes through the wrapped model on its own: whatever wraps it counts every attempt.
"""

from __future__ import annotations

import random
from collections.abc import AsyncGenerator, Callable
from dataclasses import dataclass

import anyio

from hierplan.errors import ModelError
from hierplan.models.base import (
    Model,
    ModelRequest,
    ModelResponse,
    StreamItem,
    WrappedModel,
    stream_retried,
)

RetryHook = Callable[[int, ModelError, float], None]
"""Called before a retry with the attempt that failed (1 for the first), its error and the
delay before the next attempt."""


@dataclass(slots=True, frozen=True)
class RetryPolicy:
    """How often and how patiently a model call is retried. ``max_delay_name`` names the
    setting behind ``max_delay_s`` in the message of a call that could not wait long enough."""

    retries: int = 3
    backoff_s: float = 0.2
    max_delay_s: float = 60.0
    max_delay_name: str = "max_delay_s"

    def delay(self, attempt: int, exc: ModelError) -> float | None:
        """How long to wait before retrying attempt ``attempt``'s ``exc``, or ``None`` to give
        up now (the provider asked to wait longer than ``max_delay_s``)."""
        cap = self.max_delay_s
        backoff = min(cap, self.backoff_s * 2.0 ** (attempt - 1)) * random.uniform(0.5, 1.0)
        if exc.retry_after is None:
            return backoff
        if exc.retry_after > cap:
            return None
        return max(backoff, exc.retry_after)


class RetryingModel(WrappedModel):
    """``inner`` with its retryable errors retried (see the module docstring)."""

    __slots__ = ("on_retry", "policy")

    def __init__(
        self, inner: Model, policy: RetryPolicy, on_retry: RetryHook | None = None
    ) -> None:
        self.inner = inner
        self.policy = policy
        self.on_retry = on_retry

    async def request(self, request: ModelRequest) -> ModelResponse:
        """Send ``request`` to the wrapped model, retrying retryable errors."""
        attempt = 0
        while True:
            attempt += 1
            try:
                return await self.inner.request(request)
            except ModelError as exc:
                delay = self.delay_after(attempt, exc)
            await anyio.sleep(delay)

    def stream(self, request: ModelRequest) -> AsyncGenerator[StreamItem, None]:
        """Stream ``request`` from the wrapped model, retrying retryable errors that come
        before its first delta (after it, the reader has acted on the text: the error stands)."""
        return stream_retried(self.inner, request, self.delay_after)

    def delay_after(self, attempt: int, exc: ModelError) -> float:
        """How long to wait before retrying attempt ``attempt``'s ``exc`` (reported to
        ``on_retry``); raises it when it is not to be retried."""
        policy = self.policy
        if not exc.retryable or attempt > policy.retries:
            raise exc
        delay = policy.delay(attempt, exc)
        if delay is None:
            raise ModelError(
                f"{exc} (the provider asked to wait {exc.retry_after:g} s, more than "
                f"{policy.max_delay_name}={policy.max_delay_s:g})",
                usage=exc.usage,
                unknown_usage=exc.unknown_usage,
            ) from exc
        if self.on_retry is not None:
            self.on_retry(attempt, exc, delay)
        return delay
