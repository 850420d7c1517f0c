"""Waiting for funds: a call short of them under the ``need`` allocation, and a run's root
that its parent account cannot fund yet (``wait_for_budget``).

:class:`FundWaiters` is what a run's short calls wait on: the calls in flight and the running
leaves that may still return funds. It is woken when a call ends or an account closes, either
of which may return funds, and it picks which waiting node gives up when nobody else is at
work. :func:`until_freed` is a run's root waiting on its parent's ledger.
"""

from __future__ import annotations

from dataclasses import dataclass

import anyio

from hierplan.budgets.ledger import Ledger, LocalLedger
from hierplan.core.views import NodeView

WAIT_RECHECK_S = 0.05
"""How often a node waiting for funds looks again whether anybody is still at work."""

SHARED_LEDGER_POLL_S = 0.2
"""How often a run waiting for its budget looks at a ledger shared between processes (which
cannot wake it when another process gives something back)."""

_LOCAL_LEDGER_POLL_S = 1.0
# A local ledger wakes its waiters when it gives something back; the waiter also looks at
# this pace, in case the parent's budget grew in another way.


@dataclass(slots=True)
class _Waiter:
    """A node waiting for funds: what its call lacks (pico-dollars, tokens), whether it is a
    leaf, and whether it was told to give up."""

    short: tuple[int, int]
    leaf: bool
    gave_up: bool = False


class FundWaiters:
    """The calls of one run that wait for funds under the ``need`` allocation, and what they
    wait on: ``in_flight`` calls (counted by the budget's call scopes) and how many of the
    run's running leaves wait themselves (``waiting_leaves``)."""

    __slots__ = ("_returned", "_waiters", "in_flight", "waiting", "waiting_leaves")

    def __init__(self) -> None:
        self.in_flight = 0
        self.waiting = 0
        self.waiting_leaves = 0
        self._waiters: list[_Waiter] = []
        self._returned: anyio.Event | None = None

    def others_working(self, node: NodeView) -> bool:
        """Whether a node other than ``node`` may still return funds: a call in flight, or a
        running leaf that is not itself waiting. (Leaves that wait for a place to run are not
        counted: the places may all be taken by leaves that wait for funds.)"""
        own = 1 if node.record.kind == "executor" else 0
        running = node.run.active_leaves - self.waiting_leaves - own
        return self.in_flight > 0 or running > 0

    async def returns(self, node: NodeView, short: tuple[int, int]) -> bool:
        """Wait until a call ends or an account closes (at most :data:`WAIT_RECHECK_S`); false
        when this node was told to give up instead (see :meth:`yield_to`). ``short`` is what its
        call lacks (pico-dollars, tokens)."""
        waiter = _Waiter(short, leaf=node.record.kind == "executor")
        self.waiting += 1
        self.waiting_leaves += waiter.leaf
        self._waiters.append(waiter)
        try:
            if self._returned is None:
                self._returned = anyio.Event()
            # Looked at again now and then: a step that only calls a tool holds no account,
            # and its end, which may leave nobody at work, wakes nobody.
            with anyio.move_on_after(WAIT_RECHECK_S):
                await self._returned.wait()
        finally:
            self._waiters.remove(waiter)
            self.waiting -= 1
            if not waiter.gave_up:
                self.waiting_leaves -= waiter.leaf
        return not waiter.gave_up

    def yield_to(self, short: tuple[int, int]) -> bool:
        """When nobody else is at work and other nodes wait for funds too, one of them must
        give up so that what it holds goes to the rest: the one that lacks the most (this
        node, lacking ``short``, or a waiting one), whatever order they asked in. True when a
        waiting node was told to give up (this one then waits for what it returns)."""
        neediest = max(self._waiters, key=lambda w: (not w.gave_up, w.short), default=None)
        if neediest is None or neediest.gave_up or neediest.short <= short:
            return False
        neediest.gave_up = True
        # From now on it counts as a running leaf again: it is about to end and return funds.
        self.waiting_leaves -= neediest.leaf
        self._wake()
        return True

    def call_ended(self) -> None:
        """A call settled or released its reservation."""
        self.in_flight -= 1
        self._wake()

    def account_closed(self) -> None:
        """A node's account closed: its unspent allocation is back with its parent."""
        self._wake()

    def _wake(self) -> None:
        returned = self._returned
        if returned is not None:
            self._returned = None
            returned.set()


async def until_freed(ledger: Ledger, deadline: float | None) -> None:
    """Wait until ``ledger`` may have something more to grant, or ``deadline``."""
    now = anyio.current_time()
    if isinstance(ledger, LocalLedger):
        until = now + _LOCAL_LEDGER_POLL_S
        with anyio.CancelScope(deadline=until if deadline is None else min(until, deadline)):
            await ledger.freed().wait()
    else:
        until = now + SHARED_LEDGER_POLL_S
        await anyio.sleep_until(until if deadline is None else min(until, deadline))
