"""The :class:`~hierplan.budgets.ledger.Ledger` contract on Redis, for many processes and machines.

Every operation is one Lua script (see :mod:`hierplan.budgets.redis_scripts`), and Redis runs a
script from its first line to its last with no other command in between: a reservation's check
and its update are atomic across every process that shares the ledger, the way
:class:`~hierplan.budgets.ledger.LocalLedger`'s are within one event loop. The scripts keep the
same figures as the local ledger (see :class:`~hierplan.budgets.budget.Balance`) in one Redis
hash per account.

Amounts stay exact at any size: Redis's Lua counts in doubles (exact only up to 2^53, about
$9,000 in pico-dollars), so the scripts keep amounts as decimal strings and add, subtract and
compare them digit group by digit group.

Every key of a ledger carries its namespace as a Redis hash tag (``{batch-1}:a:7``), so a whole
ledger lives on one node of a Redis Cluster. The redis client is synchronous and thread-safe;
each operation runs in a worker thread, so the ledger works under any anyio backend. Every
operation that changes the ledger shields its wait: settle, release and close as the contract
requires, and open and reserve so that a cancellation cannot lose what Redis has already done.

Needs the ``celery`` extra (``pip install 'hierplan[celery]'``), which brings the redis client.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING, Any

import anyio
import anyio.to_thread

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
from hierplan.budgets.ledger import Ledger, Outstanding, open_refused
from hierplan.budgets.redis_scripts import SCRIPTS
from hierplan.errors import UserInputError
from hierplan.models.base import Phase

if TYPE_CHECKING:
    import redis

REDIS_INSTALL_HINT = "pip install 'hierplan[celery]'"


@dataclass(frozen=True, slots=True)
class Guard:
    """A condition on opening an account, checked in the same step as the open: the account
    opens only while the Redis hash ``key`` holds ``value`` in its field ``field``, and its id
    is then set in the field ``note`` of that hash. A process that dies just after the open
    leaves an account that the hash names, never one that nobody knows of."""

    key: str
    field: str
    value: str
    note: str


class GuardFailed(LedgerError):
    """An open refused by its :class:`Guard`: the hash no longer holds the value."""


class RedisAccount(Account):
    """An account of a :class:`RedisLedger`: its id in Redis, and its name and parent."""

    __slots__ = ("id",)

    def __init__(self, name: str, parent: Account | None, account_id: str) -> None:
        super().__init__(name, parent)
        self.id = account_id


class RedisReservation(Reservation):
    """A reservation held in Redis under ``id``."""

    __slots__ = ("id",)

    def __init__(
        self, account: Account, tokens: int, pico: int, phase: Phase, reservation_id: str
    ) -> None:
        super().__init__(account, tokens, pico, phase)
        self.id = reservation_id


def connect(url: str) -> redis.Redis:
    """A Redis client for ``url`` (``redis://host:port/db``), or a clear error."""
    try:
        import redis
    except ImportError:  # pragma: no cover - the extra is installed in development
        raise UserInputError(
            f"the Redis ledger needs the redis client: {REDIS_INSTALL_HINT}"
        ) from None
    try:
        return redis.Redis.from_url(url, decode_responses=True)
    except ValueError as exc:
        raise UserInputError(f"not a Redis URL: {url!r} ({exc})") from None


def check_reachable(url: str, shown: str | None = None) -> None:
    """Refuse a Redis that does not answer at ``url``, in one line saying so (naming it as
    ``shown``: the URL with its password hidden, say)."""
    client = connect(url)
    try:
        client.ping()
    except Exception as exc:  # connection refused, a wrong password, a timeout...
        raise UserInputError(f"cannot reach Redis at {shown or url}: {exc}") from None
    finally:
        client.close()


class RedisLedger(Ledger):
    """The ledger contract on Redis: every method one atomic Lua script.

    ``client`` is a ``redis.Redis`` (with ``decode_responses=True``) or a URL; ``namespace``
    keeps this ledger's keys apart from others on the same server (a fresh one by default).
    Accounts opened here can be found again from any process with :meth:`account`.

    >>> ledger = RedisLedger("redis://127.0.0.1:6379/0", namespace="batch-1")  # doctest: +SKIP
    """

    def __init__(self, client: redis.Redis | str, namespace: str | None = None) -> None:
        self.client: redis.Redis = connect(client) if isinstance(client, str) else client
        self.namespace = namespace or uuid.uuid4().hex
        if "{" in self.namespace or "}" in self.namespace:
            raise LedgerError("a ledger namespace cannot contain braces")
        register = self.client.register_script
        self._open = register(SCRIPTS["open"])
        self._reserve = register(SCRIPTS["reserve"])
        self._settle = register(SCRIPTS["settle"])
        self._close = register(SCRIPTS["close"])
        self._available = register(SCRIPTS["available"])
        self._write_off = register(SCRIPTS["write_off"])
        self._top_up = register(SCRIPTS["top_up"])

    # -- plumbing ------------------------------------------------------------------------

    def _key(self, suffix: str) -> str:
        return f"{{{self.namespace}}}:{suffix}"

    def account_key(self, account: Account | str) -> str:
        """The Redis hash that holds the figures of ``account`` (or of the account with that
        id): ``st``/``sp`` spent, ``rt``/``rp`` reserved, and the others of
        :mod:`hierplan.budgets.redis_scripts`."""
        return self._key(f"a:{account if isinstance(account, str) else self._id(account)}")

    def _call_now(self, script: Any, *args: object) -> Any:
        import redis

        try:
            return script(keys=[self._key("seq")], args=[self.namespace, *args])
        except redis.ResponseError as exc:
            message = str(exc)
            if "ledger:" in message:
                raise LedgerError(message.split("ledger:", 1)[1]) from None
            raise

    async def _call(self, script: Any, *args: object, shield: bool = False) -> Any:
        call = partial(self._call_now, script, *args)
        if shield:
            with anyio.CancelScope(shield=True):
                return await anyio.to_thread.run_sync(call)
        return await anyio.to_thread.run_sync(call)

    @staticmethod
    def _id(account: Account) -> str:
        if not isinstance(account, RedisAccount):
            raise LedgerError(f"account {account.name!r} belongs to another ledger")
        return account.id

    # -- the contract --------------------------------------------------------------------

    async def open(
        self, name: str, parent: Account | None, grant: Grant, *, guard: Guard | None = None
    ) -> RedisAccount:
        """See :meth:`Ledger.open`; with a ``guard``, opens only while it holds (else raises
        :class:`GuardFailed`) and notes the account's id where it says."""
        if parent is None:
            if not isinstance(grant, Fixed):
                raise LedgerError(f"the root account {name!r} needs a Fixed grant")
            args: tuple[object, ...] = ("", "root", _amount(grant.tokens), _amount(grant.pico))
        elif isinstance(grant, Draw):
            _check_fraction(grant.fraction)
            args = (self._id(parent), "draw", repr(float(grant.fraction)), "")
        elif isinstance(grant, Share):
            _check_fraction(grant.tokens_fraction)
            _check_fraction(grant.usd_fraction)
            args = (
                self._id(parent),
                "share",
                repr(float(grant.tokens_fraction)),
                repr(float(grant.usd_fraction)),
            )
        else:
            args = (self._id(parent), "fixed", _amount(grant.tokens), _amount(grant.pico))
        if guard is not None:
            args = (*args, guard.key, guard.field, guard.value, guard.note)
        # Shielded: a cancellation arriving while Redis opens the account must not lose it.
        reply = await self._call(self._open, name, *args, shield=True)
        if reply[0] == "guarded":
            assert guard is not None
            raise GuardFailed(
                f"account {name!r} was not opened: the field {guard.field!r} of {guard.key} "
                f"no longer holds {guard.value!r}"
            )
        if reply[0] == "nofit":
            assert isinstance(grant, Fixed) and parent is not None
            raise open_refused(
                name, parent.name, (grant.tokens, grant.pico), (_opt(reply[1]), _opt(reply[2]))
            )
        return RedisAccount(name, parent, reply[1])

    async def reserve(
        self, account: Account, tokens: int, pico: int, phase: Phase
    ) -> Reservation | None:
        """See :meth:`Ledger.reserve`."""
        reply = await self._call(
            self._reserve, self._id(account), _amount(tokens), _amount(pico), phase, shield=True
        )
        if not reply:
            return None
        return RedisReservation(account, tokens, pico, phase, reply)

    async def settle(self, reservation: Reservation, tokens: int, pico: int) -> None:
        """See :meth:`Ledger.settle`."""
        if tokens < 0 or pico < 0:
            raise LedgerError(f"usage cannot be negative ({tokens} tokens, {pico} pico)")
        await self._finish(reservation, tokens, pico, used=True)

    async def release(self, reservation: Reservation) -> None:
        """See :meth:`Ledger.release`."""
        await self._finish(reservation, 0, 0, used=False)

    async def _finish(self, reservation: Reservation, tokens: int, pico: int, used: bool) -> None:
        if not isinstance(reservation, RedisReservation):
            raise LedgerError("the reservation belongs to another ledger")
        if not reservation.open:
            raise LedgerError(f"a reservation of {reservation.account.name!r} was settled twice")
        reservation.open = False
        await self._call(
            self._settle, reservation.id, str(tokens), str(pico), "1" if used else "0", shield=True
        )

    async def top_up(self, account: Account, tokens: int, pico: int) -> bool:
        """See :meth:`Ledger.top_up`."""
        if tokens < 0 or pico < 0:
            raise LedgerError(f"a top-up cannot be negative ({tokens} tokens, {pico} pico)")
        reply = await self._call(
            self._top_up, self._id(account), _amount(tokens), _amount(pico), shield=True
        )
        return str(reply) == "1"

    async def close(self, account: Account) -> Balance:
        """See :meth:`Ledger.close`."""
        reply = await self._call(self._close, self._id(account), shield=True)
        return _balance(_pairs(reply))

    async def available(self, account: Account) -> tuple[int | None, int | None]:
        """See :meth:`Ledger.available`."""
        tokens, pico = await self._call(self._available, self._id(account))
        return _opt(tokens), _opt(pico)

    async def balance(self, account: Account) -> Balance:
        """See :meth:`Ledger.balance`."""
        fields = await anyio.to_thread.run_sync(self.client.hgetall, self.account_key(account))
        if not fields:
            raise LedgerError(f"account {account.name!r} does not exist in this ledger")
        return _balance({str(k): str(v) for k, v in fields.items()})

    async def outstanding(self) -> Outstanding:
        """See :meth:`Ledger.outstanding`."""
        out = await anyio.to_thread.run_sync(self.client.hgetall, self._key("out"))
        return Outstanding(
            int(out.get("n", 0)),
            int(out.get("t", 0)),
            int(out.get("p", 0)),
            int(out.get("accounts", 0)),
        )

    # -- beyond the contract: many processes -----------------------------------------------

    async def account(self, account_id: str) -> RedisAccount:
        """The account with ``account_id`` (from :attr:`RedisAccount.id`), opened by any
        process, with its ancestors."""

        def chain() -> list[tuple[str, str, str]]:
            found = []
            current: str | None = account_id
            while current:
                name, parent = self.client.hmget(self._key(f"a:{current}"), ["name", "parent"])
                if name is None:
                    raise LedgerError(f"no account {current!r} in ledger {self.namespace!r}")
                found.append((current, str(name), str(parent or "")))
                current = str(parent) if parent else None
            return found

        parent: RedisAccount | None = None
        for found_id, name, _ in reversed(await anyio.to_thread.run_sync(chain)):
            parent = RedisAccount(name, parent, found_id)
        assert parent is not None
        return parent

    async def write_off(self, account: Account) -> Balance:
        """Close an account whose holder is gone (a crashed worker): each of its open
        reservations counts as spent at its worst case (the calls may have been billed), and
        the rest of its allocation returns to its parent. An account with open child accounts
        cannot be written off; a closed one is returned as it is."""
        reply = await self._call(self._write_off, self._id(account), shield=True)
        return _balance(_pairs(reply))

    def drop(self) -> int:
        """Delete every key of this ledger (blocking); returns how many were deleted."""
        keys = list(self.client.scan_iter(match=self._key("*"), count=1000))
        for start in range(0, len(keys), 500):
            self.client.delete(*keys[start : start + 500])
        return len(keys)


def _amount(value: int | None) -> str:
    if value is None:
        return ""
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise LedgerError(f"amounts are whole numbers >= 0, not {value!r}")
    return str(value)


def _opt(text: str) -> int | None:
    return None if text == "" else int(text)


def _pairs(reply: Any) -> dict[str, str]:
    if isinstance(reply, dict):
        return reply
    return dict(zip(reply[::2], reply[1::2], strict=True))


def _int(fields: dict[str, str], name: str) -> int:
    return int(fields.get(name) or 0)


def _balance(f: dict[str, str]) -> Balance:
    """A :class:`Balance` from an account's hash, as ``LocalLedger.balance_now`` builds it."""
    limit_t, limit_p = _opt(f.get("lt", "")), _opt(f.get("lp", ""))
    closed = f.get("closed") == "1"
    fixed = f.get("fixed") == "1"
    released_t = _int(f, "xt") if closed or not fixed else 0
    released_p = _int(f, "xp") if closed or not fixed else 0
    return Balance(
        f["name"],
        f["kind"],
        limit_t,
        limit_p,
        _int(f, "at") if limit_t is not None else None,
        _int(f, "ap") if limit_p is not None else None,
        _int(f, "st"),
        _int(f, "sp"),
        released_t if limit_t is not None else None,
        released_p if limit_p is not None else None,
        _int(f, "rt"),
        _int(f, "rp"),
        _int(f, "gt"),
        _int(f, "gp"),
        _int(f, "kt"),
        _int(f, "kp"),
        _int(f, "ot"),
        _int(f, "op"),
        {"planning": (_int(f, "qt"), _int(f, "qp")), "execution": (_int(f, "et"), _int(f, "ep"))},
        _int(f, "denied"),
        closed,
    )


def _check_fraction(fraction: float) -> None:
    if not 0.0 <= fraction <= 1.0:
        raise LedgerError(f"a fraction must be between 0 and 1, not {fraction!r}")
