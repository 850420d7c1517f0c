"""The ledger that enforces budgets: :class:`Ledger` is the contract, :class:`LocalLedger`
keeps it for one event loop (:mod:`hierplan.budgets.redis_ledger` keeps it for many
processes). See :mod:`hierplan.budgets.budget` for the accounts, grants and amounts."""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass

import anyio

from hierplan.budgets.budget import (
    Account,
    Balance,
    Draw,
    Fixed,
    Grant,
    LedgerError,
    Reservation,
    Share,
)
from hierplan.errors import BudgetExceeded
from hierplan.models.base import Phase
from hierplan.units import pico_to_usd


@dataclass(slots=True, frozen=True)
class Outstanding:
    """What a ledger holds right now: open reservations and accounts."""

    reservations: int
    tokens: int
    pico: int
    accounts: int


class Ledger(ABC):
    """The contract every ledger keeps (local, or shared between processes).

    Each method is atomic: no other reservation can be decided between its check and its
    update. ``settle``, ``release`` and ``close`` must complete even while the calling task is
    being cancelled (an implementation that waits for I/O shields that wait), so a cancelled
    call or node never leaves anything held.
    """

    @abstractmethod
    async def open(self, name: str, parent: Account | None, grant: Grant) -> Account:
        """Open an account funded by ``grant`` from ``parent`` (a root needs a :class:`Fixed`
        grant). Raises :class:`BudgetExceeded` if a :class:`Fixed` grant does not fit."""

    @abstractmethod
    async def reserve(
        self, account: Account, tokens: int, pico: int, phase: Phase
    ) -> Reservation | None:
        """Hold ``tokens`` and ``pico`` for one call, or return ``None`` if they do not fit
        the account and every ancestor it draws from."""

    @abstractmethod
    async def settle(self, reservation: Reservation, tokens: int, pico: int) -> None:
        """Record the call's actual usage and release the rest of the reservation. Usage above
        the reservation is charged all the same and counted as an overrun."""

    @abstractmethod
    async def release(self, reservation: Reservation) -> None:
        """Release the whole reservation: the call used nothing."""

    @abstractmethod
    async def top_up(self, account: Account, tokens: int, pico: int) -> bool:
        """Move ``tokens`` and ``pico`` from what the parent of ``account`` has free into the
        account's allocation (and limit), if they fit there; ``False`` (nothing moved) when
        they do not, or when the account does not hold an allocation of its own (a root, an
        account that draws). Only limited dimensions move. Closing the account returns them
        with the rest."""

    @abstractmethod
    async def close(self, account: Account) -> Balance:
        """Close an account with nothing in flight; its unspent allocation returns to the
        parent. Returns its final balance."""

    @abstractmethod
    async def available(self, account: Account) -> tuple[int | None, int | None]:
        """Tokens and pico-dollars the account could reserve now (``None``: unlimited)."""

    @abstractmethod
    async def balance(self, account: Account) -> Balance:
        """The account's figures now."""

    @abstractmethod
    async def outstanding(self) -> Outstanding:
        """Open reservations and open accounts in the whole ledger."""


class LocalAccount(Account):
    """A :class:`LocalLedger` account: plain integer counters (see :class:`Balance`)."""

    __slots__ = (
        "alloc_p",
        "alloc_t",
        "children",
        "closed",
        "denied",
        "exec_p",
        "exec_t",
        "fixed",
        "grant_kind",
        "granted_p",
        "granted_t",
        "limit_p",
        "limit_t",
        "over_p",
        "over_t",
        "peak_p",
        "peak_t",
        "plan_p",
        "plan_t",
        "rel_p",
        "rel_t",
        "res_p",
        "res_t",
        "spent_p",
        "spent_t",
        "up",
    )

    def __init__(
        self,
        name: str,
        parent: LocalAccount | None,
        grant_kind: str,
        limit_t: int | None,
        limit_p: int | None,
    ) -> None:
        super().__init__(name, parent)
        self.up = parent  # the parent, typed as a local account
        self.grant_kind = grant_kind
        # A fixed account holds its allocation; a drawing one takes from its parent per call.
        self.fixed = grant_kind != "draw"
        self.limit_t = limit_t
        self.limit_p = limit_p
        self.alloc_t = (limit_t or 0) if self.fixed else 0
        self.alloc_p = (limit_p or 0) if self.fixed else 0
        self.spent_t = self.spent_p = 0
        self.res_t = self.res_p = 0
        self.granted_t = self.granted_p = 0
        self.rel_t = self.rel_p = 0
        self.peak_t = self.peak_p = 0
        self.over_t = self.over_p = 0
        self.plan_t = self.plan_p = 0
        self.exec_t = self.exec_p = 0
        self.children = 0
        self.denied = 0
        self.closed = False


class LocalLedger(Ledger):
    """The ledger of one event loop: plain counters, no locks.

    Why no lock: every method runs from its first line to its last without an ``await``, so
    under one event loop no other task can run between a check and its update; a reservation
    is atomic by construction and costs a few integer operations. The price is that the ledger
    belongs to the loop that uses it: never call it from another thread.
    Reserve and settle are O(depth) for drawing accounts and O(1) otherwise.
    """

    def __init__(self) -> None:
        self._open_reservations = 0
        self._out_t = 0
        self._out_p = 0
        self._open_accounts = 0
        self._freed: anyio.Event | None = None

    def freed(self) -> anyio.Event:
        """An event set the next time something is given back in this ledger (a settlement
        or a release returns what a call held and did not use, an account closes and returns
        what it did not spend): what a run waiting for its budget waits on."""
        if self._freed is None:
            self._freed = anyio.Event()
        return self._freed

    def _notify(self) -> None:
        """Wake whoever waits on :meth:`freed` (one check when nobody does)."""
        freed = self._freed
        if freed is not None:
            self._freed = None
            freed.set()

    # -- the contract --------------------------------------------------------------------

    async def open(self, name: str, parent: Account | None, grant: Grant) -> LocalAccount:
        """See :meth:`Ledger.open`."""
        return self.open_now(name, parent, grant)

    async def reserve(
        self, account: Account, tokens: int, pico: int, phase: Phase
    ) -> Reservation | None:
        """See :meth:`Ledger.reserve`."""
        return self.reserve_now(account, tokens, pico, phase)

    async def settle(self, reservation: Reservation, tokens: int, pico: int) -> None:
        """See :meth:`Ledger.settle`."""
        self.settle_now(reservation, tokens, pico)

    async def release(self, reservation: Reservation) -> None:
        """See :meth:`Ledger.release`."""
        self.settle_now(reservation, 0, 0, used=False)

    async def top_up(self, account: Account, tokens: int, pico: int) -> bool:
        """See :meth:`Ledger.top_up`."""
        return self.top_up_now(account, tokens, pico)

    async def close(self, account: Account) -> Balance:
        """See :meth:`Ledger.close`."""
        return self.close_now(account)

    async def available(self, account: Account) -> tuple[int | None, int | None]:
        """See :meth:`Ledger.available`."""
        return self.available_now(account)

    async def balance(self, account: Account) -> Balance:
        """See :meth:`Ledger.balance`."""
        return self.balance_now(account)

    async def outstanding(self) -> Outstanding:
        """See :meth:`Ledger.outstanding`."""
        return Outstanding(self._open_reservations, self._out_t, self._out_p, self._open_accounts)

    # -- synchronous core (each call is atomic: no await inside) ---------------------------

    def open_now(self, name: str, parent: Account | None, grant: Grant) -> LocalAccount:
        """:meth:`open` without the coroutine."""
        if parent is None:
            if not isinstance(grant, Fixed):
                raise LedgerError(f"the root account {name!r} needs a Fixed grant")
            account = LocalAccount(name, None, "root", grant.tokens, grant.pico)
            self._open_accounts += 1
            return account
        up = self._local(parent)
        if up.closed:
            raise LedgerError(f"account {up.name!r} is closed; it cannot fund {name!r}")
        avail_t, avail_p = self.available_now(up)
        if isinstance(grant, Draw):
            _check_fraction(grant.fraction)
            account = LocalAccount(
                name, up, "draw", _part(avail_t, grant.fraction), _part(avail_p, grant.fraction)
            )
        else:
            if isinstance(grant, Share):
                _check_fraction(grant.tokens_fraction)
                _check_fraction(grant.usd_fraction)
                kind = "share"
                want_t = _part(avail_t, grant.tokens_fraction)
                want_p = _part(avail_p, grant.usd_fraction)
            else:
                kind = "fixed"
                want_t, want_p = grant.tokens, grant.pico
                if (want_t is None and avail_t is not None) or (
                    want_p is None and avail_p is not None
                ):
                    raise LedgerError(
                        f"account {name!r} cannot be unlimited where its parent is limited"
                    )
                if not self._fits(up, want_t or 0, want_p or 0):
                    raise open_refused(name, up.name, (want_t, want_p), (avail_t, avail_p))
            account = LocalAccount(name, up, kind, want_t, want_p)
            self._take(up, account.alloc_t, account.alloc_p, grant=True)
        up.children += 1
        self._open_accounts += 1
        return account

    def reserve_now(
        self, account: Account, tokens: int, pico: int, phase: Phase
    ) -> Reservation | None:
        """:meth:`reserve` without the coroutine."""
        acc = self._local(account)
        if acc.closed:
            raise LedgerError(f"account {acc.name!r} is closed")
        if not self._fits(acc, tokens, pico):
            acc.denied += 1
            return None
        self._take(acc, tokens, pico, grant=False)
        self._open_reservations += 1
        self._out_t += tokens
        self._out_p += pico
        return Reservation(acc, tokens, pico, phase)

    def settle_now(
        self, reservation: Reservation, tokens: int, pico: int, *, used: bool = True
    ) -> None:
        """:meth:`settle` (or, with ``used=False``, :meth:`release`) without the coroutine."""
        if not reservation.open:
            raise LedgerError(f"a reservation of {reservation.account.name!r} was settled twice")
        if tokens < 0 or pico < 0:
            raise LedgerError(f"usage cannot be negative ({tokens} tokens, {pico} pico)")
        reservation.open = False
        self._open_reservations -= 1
        held_t, held_p = reservation.tokens, reservation.pico
        self._out_t -= held_t
        self._out_p -= held_p
        acc = self._local(reservation.account)
        if used:
            if reservation.phase == "planning":
                acc.plan_t += tokens
                acc.plan_p += pico
            else:
                acc.exec_t += tokens
                acc.exec_p += pico
            if tokens > held_t:
                acc.over_t += tokens - held_t
            if pico > held_p:
                acc.over_p += pico - held_p
        a: LocalAccount | None = acc
        while a is not None:
            a.res_t -= held_t
            a.res_p -= held_p
            a.spent_t += tokens
            a.spent_p += pico
            if a.fixed:
                break
            _returned(a, held_t, held_p, tokens, pico)
            a = a.up
        if self._freed is not None:
            self._notify()

    def top_up_now(self, account: Account, tokens: int, pico: int) -> bool:
        """:meth:`top_up` without the coroutine."""
        acc = self._local(account)
        up = acc.up
        if up is None or not acc.fixed or acc.closed:
            return False
        if tokens < 0 or pico < 0:
            raise LedgerError(f"a top-up cannot be negative ({tokens} tokens, {pico} pico)")
        tokens = 0 if acc.limit_t is None else tokens
        pico = 0 if acc.limit_p is None else pico
        if not self._fits(up, tokens, pico):
            return False
        self._take(up, tokens, pico, grant=True)
        if acc.limit_t is not None:
            acc.limit_t += tokens
            acc.alloc_t += tokens
        if acc.limit_p is not None:
            acc.limit_p += pico
            acc.alloc_p += pico
        return True

    def close_now(self, account: Account) -> Balance:
        """:meth:`close` without the coroutine."""
        acc = self._local(account)
        if acc.closed:
            raise LedgerError(f"account {acc.name!r} is already closed")
        if acc.res_t or acc.res_p or acc.granted_t or acc.granted_p or acc.children:
            raise LedgerError(
                f"account {acc.name!r} cannot close with calls or child accounts still open"
            )
        acc.closed = True
        self._open_accounts -= 1
        if acc.fixed:
            acc.rel_t = max(0, acc.alloc_t - acc.spent_t)
            acc.rel_p = max(0, acc.alloc_p - acc.spent_p)
        up = acc.up
        if up is not None:
            up.children -= 1
        if self._freed is not None:
            self._notify()  # a waiter runs once this returns, with the figures below done
        if not acc.fixed:
            return self.balance_now(acc)
        # The child's allocation comes back: its spend stays spent, the rest is free again.
        a = up
        while a is not None:
            a.granted_t -= acc.alloc_t
            a.granted_p -= acc.alloc_p
            a.spent_t += acc.spent_t
            a.spent_p += acc.spent_p
            if a.fixed:
                break
            _returned(a, acc.alloc_t, acc.alloc_p, acc.spent_t, acc.spent_p)
            a = a.up
        return self.balance_now(acc)

    def available_now(self, account: Account) -> tuple[int | None, int | None]:
        """:meth:`available` without the coroutine."""
        a: LocalAccount | None = self._local(account)
        best_t: int | None = None
        best_p: int | None = None
        while a is not None:
            if a.limit_t is not None:
                room = a.limit_t - a.spent_t - a.res_t - a.granted_t
                best_t = room if best_t is None else min(best_t, room)
            if a.limit_p is not None:
                room = a.limit_p - a.spent_p - a.res_p - a.granted_p
                best_p = room if best_p is None else min(best_p, room)
            if a.fixed:
                break
            a = a.up
        return (
            None if best_t is None else max(0, best_t),
            None if best_p is None else max(0, best_p),
        )

    def balance_now(self, account: Account) -> Balance:
        """:meth:`balance` without the coroutine."""
        a = self._local(account)
        limited_t = a.limit_t is not None
        limited_p = a.limit_p is not None
        if a.fixed:
            released_t = a.rel_t if a.closed else 0
            released_p = a.rel_p if a.closed else 0
        else:
            released_t, released_p = a.rel_t, a.rel_p
        # Positional: this runs once per node, and keyword calls cost several times more.
        return Balance(
            a.name,
            a.grant_kind,
            a.limit_t,
            a.limit_p,
            a.alloc_t if limited_t else None,
            a.alloc_p if limited_p else None,
            a.spent_t,
            a.spent_p,
            released_t if limited_t else None,
            released_p if limited_p else None,
            a.res_t,
            a.res_p,
            a.granted_t,
            a.granted_p,
            a.peak_t,
            a.peak_p,
            a.over_t,
            a.over_p,
            {"planning": (a.plan_t, a.plan_p), "execution": (a.exec_t, a.exec_p)},
            a.denied,
            a.closed,
        )

    # -- internals -----------------------------------------------------------------------

    @staticmethod
    def _local(account: Account) -> LocalAccount:
        if not isinstance(account, LocalAccount):
            raise LedgerError(f"account {account.name!r} belongs to another ledger")
        return account

    @staticmethod
    def _fits(account: LocalAccount, tokens: int, pico: int) -> bool:
        """Whether the amount fits this account and every ancestor it draws from."""
        a: LocalAccount | None = account
        while a is not None:
            if a.limit_t is not None and a.spent_t + a.res_t + a.granted_t + tokens > a.limit_t:
                return False
            if a.limit_p is not None and a.spent_p + a.res_p + a.granted_p + pico > a.limit_p:
                return False
            if a.fixed:
                return True
            a = a.up
        return True

    @staticmethod
    def _take(account: LocalAccount, tokens: int, pico: int, *, grant: bool) -> None:
        """Hold the amount at this account and at every ancestor it draws from."""
        a: LocalAccount | None = account
        while a is not None:
            if grant:
                a.granted_t += tokens
                a.granted_p += pico
            else:
                a.res_t += tokens
                a.res_p += pico
                if a.res_t > a.peak_t:
                    a.peak_t = a.res_t
                if a.res_p > a.peak_p:
                    a.peak_p = a.res_p
            if a.fixed:
                return
            # A drawing account's allocation is what it took from its parent.
            a.alloc_t += tokens
            a.alloc_p += pico
            a = a.up


def _returned(a: LocalAccount, held_t: int, held_p: int, used_t: int, used_p: int) -> None:
    """A drawing account gives back what it held but did not use (or takes more on overrun)."""
    if held_t >= used_t:
        a.rel_t += held_t - used_t
    else:
        a.alloc_t += used_t - held_t
    if held_p >= used_p:
        a.rel_p += held_p - used_p
    else:
        a.alloc_p += used_p - held_p


def _check_fraction(fraction: float) -> None:
    if not 0.0 <= fraction <= 1.0:
        raise LedgerError(f"a fraction must be between 0 and 1, not {fraction!r}")


def _part(available: int | None, fraction: float) -> int | None:
    if available is None:
        return None
    # int() of a float product can round up past ``available`` for huge values: clamp it.
    return min(available, int(available * fraction))


def _fmt_avail(tokens: int | None, pico: int | None) -> str:
    """An amount in the dimensions it has (``None``: not limited there), as messages show it."""
    parts = []
    if tokens is not None:
        parts.append(f"{tokens:,} tokens")
    if pico is not None:
        parts.append(f"${pico_to_usd(pico):.6f}")
    return " and ".join(parts) or "an unlimited budget"


def open_refused(
    name: str,
    parent: str,
    wanted: tuple[int | None, int | None],
    available: tuple[int | None, int | None],
) -> BudgetExceeded:
    """The error of a :class:`Fixed` grant that does not fit its parent: what it needs and
    what the parent has left, each in the dimensions that are limited (a USD-only budget's
    message names USD only)."""
    return BudgetExceeded(
        f"{name!r} needs {_fmt_avail(*wanted)} but {parent!r} has only "
        f"{_fmt_avail(*available)} left"
    )
