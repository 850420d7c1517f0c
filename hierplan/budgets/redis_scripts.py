"""The Lua scripts of :class:`~hierplan.budgets.redis_ledger.RedisLedger`, one per operation.

Each script is the shared prelude (exact decimal arithmetic on strings, and the ledger's walks up
an account's ancestors) followed by its own body. Redis runs a script from its first line to its
last with no other command in between, which is what makes every operation atomic.

Keys, all under the ledger's namespace ``P`` as a Redis hash tag: ``{P}:a:<id>`` an account (a
hash of its figures), ``{P}:a:<id>:res`` the set of its open reservations, ``{P}:r:<id>`` a
reservation, ``{P}:out`` what is outstanding, ``{P}:seq`` the id counter. Fields of an account:
``lt``/``lp`` limits, ``at``/``ap`` allocated, ``st``/``sp`` spent, ``rt``/``rp`` reserved,
``gt``/``gp`` granted to fixed children, ``xt``/``xp`` released, ``kt``/``kp`` peak reserved,
``ot``/``op`` overrun, ``qt``/``qp`` and ``et``/``ep`` spent by phase (planning, execution).

An operation on an account that is not there is refused and writes nothing: a batch deletes its
ledger when it finishes (:meth:`~hierplan.budgets.redis_ledger.RedisLedger.drop`), and a
delivery of it still running must neither find an account without limits nor leave new keys.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

# Exact non-negative integers as decimal strings, in groups of 7 digits (exact in doubles).
# Amounts of up to 15 digits (below $1,000 in pico-dollars) take a shortcut: their sum is below
# 2^53, so Lua's doubles add and subtract them exactly.
PRELUDE = r"""
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
  if #a <= 15 and #b <= 15 then return string.format('%.0f', tonumber(a) + tonumber(b)) end
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
  if #a <= 15 then return string.format('%.0f', tonumber(a) - tonumber(b)) end
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
-- An account that is not there (its batch finished and dropped the ledger) is refused: read as
-- empty it would have no limits, and writing to it would leave keys nothing deletes.
local function missing(id)
  if redis.call('EXISTS', key(id)) == 1 then return nil end
  return redis.error_reply("ledger:no account '" .. id .. "' in this ledger")
end
local function limit(k, f)
  local v = redis.call('HGET', k, f)
  if v == false or v == '' then return nil end
  return v
end
local function inc(k, f, amount) redis.call('HSET', k, f, add(get(k, f), amount)) end
local function dec(k, f, amount) redis.call('HSET', k, f, sub(get(k, f), amount)) end
-- An account's limits, what it has used (spent + reserved + granted), its kind and parent,
-- in one HMGET: the checks walk every ancestor up to the first fixed one.
local function figures(k)
  local f = redis.call('HMGET', k, 'lt', 'lp', 'st', 'rt', 'gt', 'sp', 'rp', 'gp', 'fixed',
    'parent')
  local function opt(v) if v == false or v == '' then return nil end return v end
  return {
    lt = opt(f[1]), lp = opt(f[2]),
    ut = add(add(f[3] or '0', f[4] or '0'), f[5] or '0'),
    up = add(add(f[6] or '0', f[7] or '0'), f[8] or '0'),
    fixed = f[9] == '1', parent = opt(f[10]),
  }
end
local function fits(id, t, p)
  while id do
    local a = figures(key(id))
    if a.lt and cmp(add(a.ut, t), a.lt) > 0 then return false end
    if a.lp and cmp(add(a.up, p), a.lp) > 0 then return false end
    if a.fixed then return true end
    id = a.parent
  end
  return true
end
local function available(id)
  local bt, bp = nil, nil
  while id do
    local a = figures(key(id))
    if a.lt then bt = minimum(bt, sub(a.lt, a.ut)) end
    if a.lp then bp = minimum(bp, sub(a.lp, a.up)) end
    if a.fixed then break end
    id = a.parent
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
  local gone = missing(id)
  if gone then return gone end
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

# ARGV: ns, name, parent id ('' for a root), kind, a1, a2 (limits or fractions; '' = None), then
# optionally a guard: a hash, a field, the value it must hold, and the field that gets the id.
OPEN = r"""
local name, parent, kind = ARGV[2], ARGV[3], ARGV[4]
local guard = ARGV[7]
if guard and redis.call('HGET', guard, ARGV[8]) ~= ARGV[9] then return {'guarded'} end
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
-- Numbered once it is sure to open: a refused open writes nothing.
local id = tostring(redis.call('INCR', '{' .. P .. '}:seq'))
local k = key(id)
redis.call('HSET', k, 'name', name, 'kind', kind, 'fixed', fixed, 'parent', parent or '',
  'lt', lt or '', 'lp', lp or '')
if fixed == '1' then
  redis.call('HSET', k, 'at', lt or '0', 'ap', lp or '0')
  if parent then take(parent, lt or '0', lp or '0', true) end
end
if parent then redis.call('HINCRBY', key(parent), 'children', 1) end
redis.call('HINCRBY', OUT, 'accounts', 1)
if guard then redis.call('HSET', guard, ARGV[10], id) end
return {'ok', id, lt or '', lp or ''}
"""

# ARGV: ns, account id, tokens, pico, phase
RESERVE = r"""
local id = ARGV[2]
local gone = missing(id)
if gone then return gone end
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
SETTLE = r"""
return settle(ARGV[2], ARGV[3], ARGV[4], ARGV[5] == '1')
"""

# ARGV: ns, account id
CLOSE = r"""
return close(ARGV[2])
"""

# ARGV: ns, account id
AVAILABLE = r"""
local gone = missing(ARGV[2])
if gone then return gone end
local t, p = available(ARGV[2])
return {t or '', p or ''}
"""

# ARGV: ns, account id. Every open reservation counts as spent at its worst case, then close.
WRITE_OFF = r"""
local id = ARGV[2]
local gone = missing(id)
if gone then return gone end
local k = key(id)
if get(k, 'closed') == '1' then return redis.call('HGETALL', k) end
for _, rid in ipairs(redis.call('SMEMBERS', k .. ':res')) do
  local rk = rkey(rid)
  local r = settle(rid, get(rk, 't'), get(rk, 'p'), true)
  if type(r) == 'table' and r.err then return r end
end
return close(id)
"""

# ARGV: ns, account id, tokens, pico. Returns '1' when moved, '0' when not.
TOP_UP = r"""
local id = ARGV[2]
local gone = missing(id)
if gone then return gone end
local k = key(id)
local parent = limit(k, 'parent')
if get(k, 'closed') == '1' or get(k, 'fixed') ~= '1' or not parent then return '0' end
local lt, lp = limit(k, 'lt'), limit(k, 'lp')
local t, p = ARGV[3], ARGV[4]
if lt == nil then t = '0' end
if lp == nil then p = '0' end
if not fits(parent, t, p) then return '0' end
take(parent, t, p, true)
if lt then redis.call('HSET', k, 'lt', add(lt, t)) end
if lp then redis.call('HSET', k, 'lp', add(lp, p)) end
inc(k, 'at', t); inc(k, 'ap', p)
return '1'
"""

SCRIPTS: Mapping[str, str] = MappingProxyType(
    {
        "open": PRELUDE + OPEN,
        "reserve": PRELUDE + RESERVE,
        "settle": PRELUDE + SETTLE,
        "close": PRELUDE + CLOSE,
        "available": PRELUDE + AVAILABLE,
        "write_off": PRELUDE + WRITE_OFF,
        "top_up": PRELUDE + TOP_UP,
    }
)
