"""The :class:`~hierplan.budgets.budget.Ledger` contract on Redis, for many processes and machines.

Every operation is one Lua script, and Redis runs a script from its first line to its last with
no other command in between: a reservation's check and its update are atomic across every
process that shares the ledger, the way :class:`~hierplan.budgets.budget.LocalLedger`'s are
within one event loop. The scripts keep the same figures as the local ledger (see
:class:`~hierplan.budgets.budget.Balance`) in one Redis hash per account.

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
from functools import partial
from typing import TYPE_CHECKING, Any

import anyio
import anyio.to_thread

from hierplan.agents.models.base import Phase
from hierplan.budgets.budget import (
    Account,
    Balance,
    Draw,
    Fixed,
    Grant,
    Ledger,
    LedgerError,
    Outstanding,
    Reservation,
    Share,
    pico_to_usd,
)
from hierplan.errors import BudgetExceeded, UserInputError

if TYPE_CHECKING:
    import redis

REDIS_INSTALL_HINT = "pip install 'hierplan[celery]'"

# Exact non-negative integers as decimal strings, in groups of 7 digits (exact in doubles).
_PRELUDE = r"""
local P = ARGV[1]
local BASE = 10000000
local function limbs(s)
  local t, i = {}, #s
  while i >= 1 do
    local j = i - 6
    if j < 1 then j = 1 end
    t[#t + 1] = tonumber(string.sub(s, j, i))
    i = j - 1
  end
  return t
end
local function unlimbs(t)
  local n = #t
  while n > 1 and t[n] == 0 do n = n - 1 end
  local parts = {string.format('%d', t[n])}
  for k = n - 1, 1, -1 do parts[#parts + 1] = string.format('%07d', t[k]) end
  return table.concat(parts)
end
local function add(a, b)
  local x, y, r, c = limbs(a), limbs(b), {}, 0
  local n = #x
  if #y > n then n = #y end
  for k = 1, n do
    local v = (x[k] or 0) + (y[k] or 0) + c
    if v >= BASE then r[k] = v - BASE; c = 1 else r[k] = v; c = 0 end
  end
  if c > 0 then r[n + 1] = c end
  return unlimbs(r)
end
local function cmp(a, b)
  if #a ~= #b then if #a < #b then return -1 else return 1 end end
  if a == b then return 0 end
  if a < b then return -1 else return 1 end
end
local function sub(a, b)
  if cmp(a, b) <= 0 then return '0' end
  local x, y, r, c = limbs(a), limbs(b), {}, 0
  for k = 1, #x do
    local v = x[k] - (y[k] or 0) - c
    if v < 0 then r[k] = v + BASE; c = 1 else r[k] = v; c = 0 end
  end
  return unlimbs(r)
end
local function minimum(a, b)
  if a == nil then return b end
  if b == nil then return a end
  if cmp(a, b) <= 0 then return a else return b end
end
local function key(id) return '{' .. P .. '}:a:' .. id end
local function rkey(id) return '{' .. P .. '}:r:' .. id end
local OUT = '{' .. P .. '}:out'
local function get(k, f) return redis.call('HGET', k, f) or '0' end
local function limit(k, f)
  local v = redis.call('HGET', k, f)
  if v == false or v == '' then return nil end
  return v
end
local function inc(k, f, amount) redis.call('HSET', k, f, add(get(k, f), amount)) end
local function dec(k, f, amount) redis.call('HSET', k, f, sub(get(k, f), amount)) end
local function used(k, d)
  return add(add(get(k, 's' .. d), get(k, 'r' .. d)), get(k, 'g' .. d))
end
local function fits(id, t, p)
  while id do
    local k = key(id)
    local lt, lp = limit(k, 'lt'), limit(k, 'lp')
    if lt and cmp(add(used(k, 't'), t), lt) > 0 then return false end
    if lp and cmp(add(used(k, 'p'), p), lp) > 0 then return false end
    if get(k, 'fixed') == '1' then return true end
    id = limit(k, 'parent')
  end
  return true
end
local function available(id)
  local bt, bp = nil, nil
  while id do
    local k = key(id)
    local lt, lp = limit(k, 'lt'), limit(k, 'lp')
    if lt then bt = minimum(bt, sub(lt, used(k, 't'))) end
    if lp then bp = minimum(bp, sub(lp, used(k, 'p'))) end
    if get(k, 'fixed') == '1' then break end
    id = limit(k, 'parent')
  end
  return bt, bp
end
local function take(id, t, p, grant)
  while id do
    local k = key(id)
    if grant then
      inc(k, 'gt', t); inc(k, 'gp', p)
    else
      inc(k, 'rt', t); inc(k, 'rp', p)
      if cmp(get(k, 'rt'), get(k, 'kt')) > 0 then redis.call('HSET', k, 'kt', get(k, 'rt')) end
      if cmp(get(k, 'rp'), get(k, 'kp')) > 0 then redis.call('HSET', k, 'kp', get(k, 'rp')) end
    end
    if get(k, 'fixed') == '1' then return end
    inc(k, 'at', t); inc(k, 'ap', p)
    id = limit(k, 'parent')
  end
end
local function returned(k, held_t, held_p, used_t, used_p)
  if cmp(held_t, used_t) >= 0 then inc(k, 'xt', sub(held_t, used_t))
  else inc(k, 'at', sub(used_t, held_t)) end
  if cmp(held_p, used_p) >= 0 then inc(k, 'xp', sub(held_p, used_p))
  else inc(k, 'ap', sub(used_p, held_p)) end
end
local function settle(rid, t, p, was_used)
  local rk = rkey(rid)
  if redis.call('EXISTS', rk) == 0 then
    return redis.error_reply('ledger:a reservation was settled twice (or is unknown)')
  end
  local id = redis.call('HGET', rk, 'account')
  local held_t, held_p = get(rk, 't'), get(rk, 'p')
  local phase = redis.call('HGET', rk, 'phase')
  redis.call('DEL', rk)
  redis.call('SREM', key(id) .. ':res', rid)
  redis.call('HINCRBY', OUT, 'n', -1)
  dec(OUT, 't', held_t); dec(OUT, 'p', held_p)
  local k = key(id)
  if was_used then
    local f = 'e'
    if phase == 'planning' then f = 'q' end
    inc(k, f .. 't', t); inc(k, f .. 'p', p)
    if cmp(t, held_t) > 0 then inc(k, 'ot', sub(t, held_t)) end
    if cmp(p, held_p) > 0 then inc(k, 'op', sub(p, held_p)) end
  end
  while id do
    k = key(id)
    dec(k, 'rt', held_t); dec(k, 'rp', held_p)
    inc(k, 'st', t); inc(k, 'sp', p)
    if get(k, 'fixed') == '1' then break end
    returned(k, held_t, held_p, t, p)
    id = limit(k, 'parent')
  end
  return 'ok'
end
local function close(id)
  local k = key(id)
  local name = redis.call('HGET', k, 'name')
  if get(k, 'closed') == '1' then
    return redis.error_reply("ledger:account '" .. name .. "' is already closed")
  end
  for _, f in ipairs({'rt', 'rp', 'gt', 'gp', 'children'}) do
    if get(k, f) ~= '0' then
      return redis.error_reply(
        "ledger:account '" .. name .. "' cannot close with calls or child accounts still open")
    end
  end
  redis.call('HSET', k, 'closed', '1')
  redis.call('HINCRBY', OUT, 'accounts', -1)
  local at, ap, st, sp = get(k, 'at'), get(k, 'ap'), get(k, 'st'), get(k, 'sp')
  local fixed = get(k, 'fixed') == '1'
  if fixed then
    redis.call('HSET', k, 'xt', sub(at, st), 'xp', sub(ap, sp))
  end
  local up = limit(k, 'parent')
  if up then redis.call('HINCRBY', key(up), 'children', -1) end
  if not fixed then return redis.call('HGETALL', k) end
  while up do
    local a = key(up)
    dec(a, 'gt', at); dec(a, 'gp', ap)
    inc(a, 'st', st); inc(a, 'sp', sp)
    if get(a, 'fixed') == '1' then break end
    returned(a, at, ap, st, sp)
    up = limit(a, 'parent')
  end
  return redis.call('HGETALL', k)
end
"""

# ARGV: ns, name, parent id ('' for a root), kind, a1, a2 (limits or fractions; '' = None)
_OPEN = r"""
local name, parent, kind = ARGV[2], ARGV[3], ARGV[4]
local id = tostring(redis.call('INCR', '{' .. P .. '}:seq'))
local lt, lp, fixed = nil, nil, '1'
if parent == '' then
  parent = nil
  if ARGV[5] ~= '' then lt = ARGV[5] end
  if ARGV[6] ~= '' then lp = ARGV[6] end
else
  local pk = key(parent)
  if redis.call('EXISTS', pk) == 0 then
    return redis.error_reply('ledger:unknown parent account')
  end
  if get(pk, 'closed') == '1' then
    return redis.error_reply("ledger:account '" .. redis.call('HGET', pk, 'name') ..
      "' is closed; it cannot fund '" .. name .. "'")
  end
  local at, ap = available(parent)
  local function part(avail, fraction)
    if avail == nil then return nil end
    local x = string.format('%.0f', math.floor(tonumber(avail) * tonumber(fraction)))
    return minimum(avail, x)
  end
  if kind == 'draw' then
    fixed = '0'
    lt, lp = part(at, ARGV[5]), part(ap, ARGV[5])
  elseif kind == 'share' then
    lt, lp = part(at, ARGV[5]), part(ap, ARGV[6])
  else
    if ARGV[5] ~= '' then lt = ARGV[5] end
    if ARGV[6] ~= '' then lp = ARGV[6] end
    if (lt == nil and at ~= nil) or (lp == nil and ap ~= nil) then
      return redis.error_reply("ledger:account '" .. name ..
        "' cannot be unlimited where its parent is limited")
    end
    if not fits(parent, lt or '0', lp or '0') then
      return {'nofit', at or '', ap or ''}
    end
  end
end
local k = key(id)
redis.call('HSET', k, 'name', name, 'kind', kind, 'fixed', fixed, 'parent', parent or '',
  'lt', lt or '', 'lp', lp or '')
if fixed == '1' then
  redis.call('HSET', k, 'at', lt or '0', 'ap', lp or '0')
  if parent then take(parent, lt or '0', lp or '0', true) end
end
if parent then redis.call('HINCRBY', key(parent), 'children', 1) end
redis.call('HINCRBY', OUT, 'accounts', 1)
return {'ok', id, lt or '', lp or ''}
"""

# ARGV: ns, account id, tokens, pico, phase
_RESERVE = r"""
local id = ARGV[2]
local k = key(id)
if get(k, 'closed') == '1' then
  return redis.error_reply("ledger:account '" .. redis.call('HGET', k, 'name') .. "' is closed")
end
local t, p = ARGV[3], ARGV[4]
if not fits(id, t, p) then
  redis.call('HINCRBY', k, 'denied', 1)
  return ''
end
take(id, t, p, false)
local rid = tostring(redis.call('INCR', '{' .. P .. '}:seq'))
redis.call('HSET', rkey(rid), 'account', id, 't', t, 'p', p, 'phase', ARGV[5])
redis.call('SADD', k .. ':res', rid)
redis.call('HINCRBY', OUT, 'n', 1)
inc(OUT, 't', t); inc(OUT, 'p', p)
return rid
"""

# ARGV: ns, reservation id, tokens, pico, used (1/0)
_SETTLE = r"""
return settle(ARGV[2], ARGV[3], ARGV[4], ARGV[5] == '1')
"""

# ARGV: ns, account id
_CLOSE = r"""
return close(ARGV[2])
"""

# ARGV: ns, account id
_AVAILABLE = r"""
local t, p = available(ARGV[2])
return {t or '', p or ''}
"""

# ARGV: ns, account id. Every open reservation counts as spent at its worst case, then close.
_WRITE_OFF = r"""
local id = ARGV[2]
local k = key(id)
if get(k, 'closed') == '1' then return redis.call('HGETALL', k) end
for _, rid in ipairs(redis.call('SMEMBERS', k .. ':res')) do
  local rk = rkey(rid)
  local r = settle(rid, get(rk, 't'), get(rk, 'p'), true)
  if type(r) == 'table' and r.err then return r end
end
return close(id)
"""


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
        self._open = register(_PRELUDE + _OPEN)
        self._reserve = register(_PRELUDE + _RESERVE)
        self._settle = register(_PRELUDE + _SETTLE)
        self._close = register(_PRELUDE + _CLOSE)
        self._available = register(_PRELUDE + _AVAILABLE)
        self._write_off = register(_PRELUDE + _WRITE_OFF)

    # -- plumbing ------------------------------------------------------------------------

    def _key(self, suffix: str) -> str:
        return f"{{{self.namespace}}}:{suffix}"

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

    async def open(self, name: str, parent: Account | None, grant: Grant) -> RedisAccount:
        """See :meth:`Ledger.open`."""
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
        # Shielded: a cancellation arriving while Redis opens the account must not lose it.
        reply = await self._call(self._open, name, *args, shield=True)
        if reply[0] == "nofit":
            assert isinstance(grant, Fixed) and parent is not None
            avail = _fmt_avail(_opt(reply[1]), _opt(reply[2]))
            raise BudgetExceeded(
                f"{name!r} needs {grant.tokens or 0:,} tokens and "
                f"${pico_to_usd(grant.pico or 0):g} but {parent.name!r} has only {avail} left"
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
        key = self._key(f"a:{self._id(account)}")
        fields = await anyio.to_thread.run_sync(self.client.hgetall, key)
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


def _fmt_avail(tokens: int | None, pico: int | None) -> str:
    parts = []
    if tokens is not None:
        parts.append(f"{tokens:,} tokens")
    if pico is not None:
        parts.append(f"${pico_to_usd(pico):.6f}")
    return " and ".join(parts) or "an unlimited budget"
