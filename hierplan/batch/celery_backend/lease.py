"""Leases: how a batch learns within seconds that a worker running its goal has died.

A delivery that claims a goal takes a **lease** on it: a Redis key with a time to live
(``{ns}:l:<goal id>``, holding the delivery's fence). While the delivery runs, its worker
process's :class:`Heartbeat` renews the lease every third of its length; a worker that dies
(``SIGKILL``, a lost machine) stops renewing, and Redis lets the key expire. The driver, which
looks at its goals' states several times a second, sends a goal whose lease has lapsed to the
queue again (:data:`REQUEUE`); the new delivery fences out the dead one and writes off its
account, as any later delivery does. So a dead worker's goals run again after about one lease
(:data:`DEFAULT_LEASE_S`), not after the broker's visibility timeout.

Redis keeps the time: the key expires on the server's clock, so the clocks of the driver's and
the workers' machines play no part. The heartbeat is a thread of its own, not a task of the
event loop the goals share: a goal that keeps the loop busy does not make its worker look dead.
"""

from __future__ import annotations

import contextlib
import math
import os
import threading
from dataclasses import dataclass, field
from typing import Any

from hierplan.errors import UserInputError

DEFAULT_LEASE_S = 30.0
"""Seconds a running goal's lease lasts without a renewal (renewed every third of that)."""
MIN_LEASE_S = 1.0
"""The shortest lease: a renewal must reach Redis well within it."""
LEASE_VARIABLE = "HIERPLAN_BATCH_LEASE_S"
"""The environment variable that sets the lease of ``hierplan batch --backend celery``."""

# KEYS: the goal's hash, its lease. ARGV: fence, lease in milliseconds. Renews the lease of the
# delivery that holds the goal's fence; a delivery fenced out, or a goal that is final or gone
# with its batch's keys, gets 0 and no key is written.
RENEW = r"""
if redis.call('HGET', KEYS[1], 'fence') ~= ARGV[1] then return 0 end
local state = redis.call('HGET', KEYS[1], 'state')
if state == 'succeeded' or state == 'failed' or state == 'skipped' then return 0 end
redis.call('SET', KEYS[2], ARGV[1], 'PX', ARGV[2])
return 1
"""

# KEYS: the goal's hash, its lease. ARGV: the id of the task just sent for the goal. A goal a
# delivery claimed whose lease has lapsed is marked queued for that task, which is then the only
# message that may claim it (until its own lease lapses): copies of the dead delivery's message
# restored later are dropped. Returns 1 if marked, 0 if the goal is final, renewed or queued.
REQUEUE = r"""
local state = redis.call('HGET', KEYS[1], 'state')
if state ~= 'claimed' and state ~= 'running' and state ~= 'waiting' then return 0 end
if redis.call('EXISTS', KEYS[2]) == 1 then return 0 end
redis.call('HSET', KEYS[1], 'state', 'queued', 'owner', ARGV[1], 'owner_retries', '-1')
redis.call('HINCRBY', KEYS[1], 'requeued', 1)
return 1
"""


def lease_key(namespace: str, goal_id: str) -> str:
    """The Redis key of a goal's lease."""
    return f"{{{namespace}}}:l:{goal_id}"


def lease_seconds(given: float | None = None, *, name: str = "the lease") -> float:
    """The lease of a batch: ``given``, else :data:`LEASE_VARIABLE` from the environment,
    else :data:`DEFAULT_LEASE_S`; a :class:`UserInputError` for one that is not a number of
    seconds of at least :data:`MIN_LEASE_S`, calling ``given`` ``name`` (``--lease`` on the
    command line)."""
    where = name
    if given is None:
        text = os.environ.get(LEASE_VARIABLE, "").strip()
        if not text:
            return DEFAULT_LEASE_S
        where = LEASE_VARIABLE
        try:
            given = float(text)
        except ValueError:
            given = math.nan
    if not math.isfinite(given) or given < MIN_LEASE_S:
        raise UserInputError(
            f"{where} must be a number of seconds of at least {MIN_LEASE_S:g}, not {given!r}"
        )
    return float(given)


@dataclass(slots=True, eq=False)
class Lease:
    """The lease one delivery holds on its goal (renewed by :class:`Heartbeat`)."""

    client: Any
    goal_key: str
    key: str
    fence: str
    seconds: float

    def renew(self) -> bool:
        """Renew it for another :attr:`seconds`; ``False`` once the delivery no longer holds
        the goal (fenced out, or the goal is final)."""
        script = self.client.register_script(RENEW)
        return bool(
            script(keys=[self.goal_key, self.key], args=[self.fence, int(self.seconds * 1000)])
        )


@dataclass(slots=True)
class Heartbeat:
    """A worker process's heartbeat: one thread that renews the lease of every goal the process
    runs, each every third of its length. It dies with the process, which is its point."""

    leases: set[Lease] = field(default_factory=set)
    lock: threading.Lock = field(default_factory=threading.Lock)
    wake: threading.Event = field(default_factory=threading.Event)
    thread: threading.Thread | None = None

    def hold(self, lease: Lease) -> None:
        """Renew ``lease`` from now on (the claim has just set it)."""
        with self.lock:
            self.leases.add(lease)
            if self.thread is None or not self.thread.is_alive():
                self.thread = threading.Thread(
                    target=self._beat, name="hierplan-lease-heartbeat", daemon=True
                )
                self.thread.start()
        self.wake.set()  # a shorter lease than those held so far renews sooner

    def release(self, lease: Lease) -> None:
        """Stop renewing ``lease`` (its delivery has ended)."""
        with self.lock:
            self.leases.discard(lease)

    def _beat(self) -> None:
        while True:
            with self.lock:
                shortest = min((lease.seconds for lease in self.leases), default=DEFAULT_LEASE_S)
            self.wake.wait(shortest / 3)
            self.wake.clear()
            with self.lock:
                held = list(self.leases)  # those released while it waited are not renewed
            for lease in held:
                with contextlib.suppress(Exception):  # Redis unreachable: try again next beat
                    if not lease.renew():
                        self.release(lease)  # fenced out or final: nothing left to renew
