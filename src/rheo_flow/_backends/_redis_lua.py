"""The Lua scripts of the Redis backend (see :mod:`rheo_flow._backends.redis` for the layout).

Every script touches the keys of ONE partition (one hash tag) or one
stream-level key, so a Redis Cluster can place partitions on different
shards. Requests and replies are compact strings (JSON or code letters): one
bulk string per reply is decoded by one ``orjson.loads`` on the client.

Delivery records (field = sequence in the ``:d`` hash of a group partition)
are ``state|attempt|lease_id|settled_by|rejected_at_ms|reason``, then NUL and
the last error when one was recorded (a nack's or reject's; NUL never occurs in
a reason or error), with state
``L`` (leased), ``A`` (available), ``K`` (acked) or ``R`` (rejected) and
settled_by ``a`` / ``n`` / ``r`` (ack, nack, reject), ``-`` (dead-lettered on
expiry) or empty. The ``:z`` sorted set holds the available and leased
deliveries scored by when they become eligible (available-at or deadline), so
a fetch finds due work in O(log n) whatever the lease time of each one.
New deliveries start in a block (``:b`` record ``first|last|deadline`` under a
token, ``:y`` the unexpired blocks by deadline). A delivery without a record of
its own that a block covers has lease id ``<token>:<seq>`` and attempt 1: it is
leased when past the group's frontier ``f``, acked by that lease when at or
behind it. So an ack that moves the frontier over its deliveries writes no
record for them; one that does not (out of order) writes ``K`` records, as
does anything that moves the frontier back (redrive). A block's deliveries get
records of their own when settled otherwise, renewed or expired.
"""

from __future__ import annotations

__all__ = ["LOST", "SCRIPTS"]

LOST = "LOST"
"""The reply of append and fetch when the partition's presence marker ``mk`` (written
when its stream was created) is gone: the server lost its data."""

_COMMON = r"""
local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
local function S(n) return string.format('%d', n) end
local function eid(n) return string.format('%d-0', n) end
local CHUNK = 2000
-- Variadic commands in chunks: Lua's unpack has a stack limit.
local function bulk(head, list)
  local n = #list
  local i = 1
  while i <= n do
    local j = math.min(i + CHUNK - 1, n)
    local args = {}
    for k = 1, #head do args[k] = head[k] end
    for k = i, j do args[#args + 1] = list[k] end
    redis.call(unpack(args))
    i = j + 1
  end
end
local function hmget(key, fields)
  local out = {}
  local n = #fields
  local i = 1
  while i <= n do
    local j = math.min(i + CHUNK - 1, n)
    local part = redis.call('HMGET', key, unpack(fields, i, j))
    for k = 1, #part do out[#out + 1] = part[k] end
    i = j + 1
  end
  return out
end
-- The last error follows the reason after a NUL (absent when none was recorded).
local function parse(r)
  local st, att, lid, by, at, reason =
    string.match(r, '^(%a)|(%d+)|([^|]*)|([^|]*)|([^|]*)|(.*)$')
  local err = nil
  local cut = reason and string.find(reason, '\0', 1, true)
  if cut then
    err = string.sub(reason, cut + 1)
    reason = string.sub(reason, 1, cut - 1)
  end
  return st, tonumber(att), lid, by, at, reason, err
end
local function rec(st, att, lid, by, at, reason, err)
  local r = st .. '|' .. S(att) .. '|' .. lid .. '|' .. by .. '|' .. at .. '|' .. reason
  if err then r = r .. '\0' .. err end
  return r
end
-- Move the frontier over every acked or rejected delivery right after it.
local function advance(D, f)
  local step = 16
  while true do
    local fields = {}
    for k = 1, step do fields[k] = S(f + k) end
    local recs = redis.call('HMGET', D, unpack(fields))
    local moved = 0
    for k = 1, step do
      local r = recs[k]
      if not r then break end
      local b = string.byte(r, 1)
      if b ~= 75 and b ~= 82 then break end
      moved = k
    end
    f = f + moved
    if moved < step then return f end
    if step < 1024 then step = step * 2 end
  end
end
local function blockspec(spec)
  local first, last, dl = string.match(spec, '^(%d+)|(%d+)|(%d+)$')
  return tonumber(first), tonumber(last), dl
end
-- Expired blocks: their entries past the frontier without a record of their own get one
-- ('L', due at the block's deadline); the part at or behind the frontier stays.
local function expire(D, Z, B, Y, tokens, f)
  if #tokens == 0 then return end
  local specs = hmget(B, tokens)
  local gone = {}
  for k, t in ipairs(tokens) do
    local spec = specs[k]
    if spec then
      local first, last, dl = blockspec(spec)
      if last > f then
        local fields = {}
        for s = math.max(first, f + 1), last do fields[#fields + 1] = S(s) end
        local cur = hmget(D, fields)
        local hs, za = {}, {}
        for i, sq in ipairs(fields) do
          if not cur[i] then
            hs[#hs + 1] = sq
            hs[#hs + 1] = 'L|1|' .. t .. ':' .. sq .. '|||'
            za[#za + 1] = dl
            za[#za + 1] = sq
          end
        end
        if #hs > 0 then
          bulk({'HSET', D}, hs)
          bulk({'ZADD', Z}, za)
        end
        if first <= f then
          redis.call('HSET', B, t, S(first) .. '|' .. S(f) .. '|' .. dl)
        else
          gone[#gone + 1] = t
        end
      end
    end
  end
  if #gone > 0 then bulk({'HDEL', B}, gone) end
  bulk({'ZREM', Y}, tokens)
end
-- Every block keeps only its part inside [lo, hi].
local function clip(B, Y, lo, hi)
  local all = redis.call('HGETALL', B)
  local gone, keep = {}, {}
  for k = 1, #all, 2 do
    local first, last, dl = blockspec(all[k + 1])
    local a, b = math.max(first, lo), math.min(last, hi)
    if a > b then
      gone[#gone + 1] = all[k]
    elseif a ~= first or b ~= last then
      keep[#keep + 1] = all[k]
      keep[#keep + 1] = S(a) .. '|' .. S(b) .. '|' .. dl
    end
  end
  if #gone > 0 then
    bulk({'HDEL', B}, gone)
    bulk({'ZREM', Y}, gone)
  end
  if #keep > 0 then bulk({'HSET', B}, keep) end
end
-- Before the frontier moves back to lo - 1: the block entries in [lo, hi] (all behind
-- it, so acked by their block lease) get an ack record of their own.
local function own_acks(D, B, lo, hi)
  local all = redis.call('HGETALL', B)
  for k = 1, #all, 2 do
    local first, last = blockspec(all[k + 1])
    local a, b = math.max(first, lo), math.min(last, hi)
    if a <= b then
      local fields = {}
      for s = a, b do fields[#fields + 1] = S(s) end
      local cur = hmget(D, fields)
      local hs = {}
      for i, sq in ipairs(fields) do
        if not cur[i] then
          hs[#hs + 1] = sq
          hs[#hs + 1] = 'K|1|' .. all[k] .. ':' .. sq .. '|a||'
        end
      end
      if #hs > 0 then bulk({'HSET', D}, hs) end
    end
  end
end
local function resolve(spec, hw, lw)
  local pos
  if spec == 'earliest' then pos = 0
  elseif spec == 'latest' then pos = hw
  else pos = tonumber(spec) end
  if pos > hw then pos = hw end
  if pos < lw - 1 then pos = lw - 1 end
  return pos
end
"""

# KEYS: streams hash. ARGV: name, partitions. Returns "partitions|created_ms".
CREATE_STREAM = r"""
local cur = redis.call('HGET', KEYS[1], ARGV[1])
if cur then return cur end
cur = ARGV[2] .. '|' .. S(now_ms())
redis.call('HSET', KEYS[1], ARGV[1], cur)
return cur
"""

# KEYS: groups hash of a stream. ARGV: group, max_attempts ('' keeps), default, start.
# Returns "max_attempts|created_ms|start".
GROUP_RECORD = r"""
local cur = redis.call('HGET', KEYS[1], ARGV[1])
if cur then
  if ARGV[2] ~= '' then
    local ma, created, start = string.match(cur, '^(%d+)|(%d+)|(.*)$')
    if ma ~= ARGV[2] then
      cur = ARGV[2] .. '|' .. created .. '|' .. start
      redis.call('HSET', KEYS[1], ARGV[1], cur)
    end
  end
  return cur
end
local ma = ARGV[2]
if ma == '' then ma = ARGV[3] end
cur = ma .. '|' .. S(now_ms()) .. '|' .. ARGV[4]
redis.call('HSET', KEYS[1], ARGV[1], cur)
return cur
"""

# KEYS: x, m, G. ARGV: group, start, max_attempts. Idempotent.
INIT_GROUP = r"""
local x, m, G = KEYS[1], KEYS[2], KEYS[3]
if redis.call('EXISTS', G) == 1 then
  redis.call('HSET', G, 'ma', ARGV[3])
  return 0
end
local mm = redis.call('HMGET', m, 'hw', 'lw')
local hw, lw = tonumber(mm[1] or '0'), tonumber(mm[2] or '1')
local pos = resolve(ARGV[2], hw, lw)
local ok = redis.pcall('XGROUP', 'CREATE', x, ARGV[1], eid(pos), 'MKSTREAM')
if type(ok) == 'table' and ok.err then
  redis.call('XGROUP', 'SETID', x, ARGV[1], eid(pos))
end
redis.call('HSET', G, 'f', S(pos), 'c', S(pos), 'ma', ARGV[3])
return 1
"""

# KEYS: stream-level id index. ARGV: JSON [[id, partition], ...].
# Returns the partition that owns each id, comma-separated.
CLAIM_IDS = r"""
local recs = cjson.decode(ARGV[1])
local ids = {}
for k, r in ipairs(recs) do ids[k] = r[1] end
local cur = hmget(KEYS[1], ids)
local seen, new, out = {}, {}, {}
for k, r in ipairs(recs) do
  local p = seen[r[1]] or cur[k]
  if not p then
    p = S(r[2])
    seen[r[1]] = p
    new[#new + 1] = r[1]
    new[#new + 1] = p
  end
  out[k] = p
end
if #new > 0 then bulk({'HSET', KEYS[1]}, new) end
return table.concat(out, ',')
"""

# KEYS: x, m, i. ARGV: JSON [[id, meta, data], ...].
# Returns LOST, or JSON [time, items]: per record its seq when stored by this call (or earlier
# in it, at `time`), [seq, time, meta, data text] when the id was already stored.
APPEND = r"""
local x, m, i = KEYS[1], KEYS[2], KEYS[3]
local mm = redis.call('HMGET', m, 'hw', 'ts', 'mk')
if not mm[3] then return 'LOST' end
local recs = cjson.decode(ARGV[1])
local hw, ts = tonumber(mm[1] or '0'), tonumber(mm[2] or '0')
local now = now_ms()
-- Append times never go backwards within a partition, even if the server clock does.
if now < ts then now = ts end
local snow = S(now)
local ids = {}
for k, r in ipairs(recs) do ids[k] = r[1] end
local known = hmget(i, ids)
local seen, new, out = {}, {}, {}
for k, r in ipairs(recs) do
  local id = r[1]
  local sq = seen[id]
  if sq then
    out[k] = sq
  else
    local stored = nil
    if known[k] then
      local e = redis.call('XRANGE', x, eid(tonumber(known[k])), eid(tonumber(known[k])))
      if e[1] then stored = e[1][2] end
    end
    if stored then
      out[k] = '[' .. known[k] .. ',' .. stored[6] .. ',' .. stored[2] .. ','
        .. cjson.encode(stored[4]) .. ']'
    else
      hw = hw + 1
      sq = S(hw)
      redis.call('XADD', x, eid(hw), 'meta', r[2], 'data', r[3], 'time', snow)
      seen[id] = sq
      new[#new + 1] = id
      new[#new + 1] = sq
      out[k] = sq
    end
  end
end
if #new > 0 then bulk({'HSET', i}, new) end
redis.call('HSET', m, 'hw', S(hw), 'ts', snow)
return '[' .. snow .. ',[' .. table.concat(out, ',') .. ']]'
"""

# KEYS: x, m, G, D, Z, R, B, Y. ARGV: group, consumer, quota, lease_ms, lease id prefix,
# block token. Returns LOST, 'NOGROUP', 'AGAIN' (this call already ran: its answer was lost)
# or an array: JSON [high_water, still_available, deadline,
# redelivered, [[seq, attempt, time, meta], ...]], then the data (JSON text) of each item.
# The first `redelivered` items have lease ids
# prefix .. 1, 2, ..., the new deliveries after them '<block token>:<seq>'.
FETCH = r"""
local x, m, G, D, Z, R, B, Y = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6], KEYS[7],
  KEYS[8]
local group, consumer, token, btoken = ARGV[1], ARGV[2], ARGV[5], ARGV[6]
local quota, lease_ms = tonumber(ARGV[3]), tonumber(ARGV[4])
local mm = redis.call('HMGET', m, 'hw', 'mk')
if not mm[2] then return 'LOST' end
local g = redis.call('HMGET', G, 'f', 'c', 'ma')
if not g[1] then return 'NOGROUP' end
-- The same call run again (the client resent it after its answer was lost): the
-- first run's block keeps its leases until they expire; granting more under the
-- same token would overwrite that block and strand its deliveries for ever.
if redis.call('HEXISTS', B, btoken) == 1 then return 'AGAIN' end
local f, c, ma = tonumber(g[1]), tonumber(g[2]), tonumber(g[3])
local hw = tonumber(mm[1] or '0')
local now = now_ms()
local snow = S(now)
local sdl = S(now + lease_ms)
local items = {}
-- The reply: the JSON head, then the data of each item as stored (no re-encoding).
local datas = {''}
local redelivered = 0
-- Blocks past their deadline become per-delivery records, found below like any other.
expire(D, Z, B, Y, redis.call('ZRANGEBYSCORE', Y, '-inf', snow), f)
if quota > 0 then
  local hs, dead, radd, due, next_att, errs = {}, {}, {}, {}, {}, {}
  local front = false
  -- Due deliveries: available (nack delay over) or leased past their deadline.
  while #due < quota do
    local ids = redis.call('ZRANGEBYSCORE', Z, '-inf', snow, 'LIMIT', 0, quota - #due)
    if #ids == 0 then break end
    local recs = hmget(D, ids)
    local zr, za = {}, {}
    for k, sq in ipairs(ids) do
      local r = recs[k]
      if not r then
        zr[#zr + 1] = sq
      else
        local st, att, lid, _, _, _, err = parse(r)
        if att >= ma then
          hs[#hs + 1] = sq
          hs[#hs + 1] = rec('R', att, lid, '-', snow, 'max_attempts', err)
          zr[#zr + 1] = sq
          radd[#radd + 1] = sq
          radd[#radd + 1] = sq
          dead[#dead + 1] = sq .. '-0'
          if tonumber(sq) == f + 1 then front = true end
        else
          local n = tonumber(sq)
          due[#due + 1] = n
          next_att[n] = att + 1
          errs[n] = err
          za[#za + 1] = sdl
          za[#za + 1] = sq
        end
      end
    end
    if #zr > 0 then bulk({'ZREM', Z}, zr) end
    if #za > 0 then bulk({'ZADD', Z}, za) end
  end
  local n = 0
  if #due > 0 then
    table.sort(due)
    local bodies = {}
    local i = 1
    while i <= #due do
      local j = math.min(i + CHUNK - 1, #due)
      local args = {'XCLAIM', x, group, consumer, '0'}
      for k = i, j do args[#args + 1] = eid(due[k]) end
      args[#args + 1] = 'FORCE'
      local claimed = redis.call(unpack(args))
      for _, e in ipairs(claimed) do
        if e then bodies[e[1]] = e[2] end
      end
      i = j + 1
    end
    local gone = {}
    for _, seq in ipairs(due) do
      local fl = bodies[eid(seq)]
      local sq = S(seq)
      if fl then
        n = n + 1
        local att = next_att[seq]
        items[#items + 1] = '[' .. sq .. ',' .. S(att) .. ',' .. fl[6] .. ',' .. fl[2] .. ']'
        datas[#datas + 1] = fl[4]
        hs[#hs + 1] = sq
        hs[#hs + 1] = rec('L', att, token .. n, '', '', '', errs[seq])
      else
        gone[#gone + 1] = sq
      end
    end
    if #gone > 0 then
      bulk({'ZREM', Z}, gone)
      bulk({'HDEL', D}, gone)
    end
  end
  redelivered = n
  -- New deliveries past the group's cursor.
  local want = quota - n
  if want > 0 and c < hw then
    local res = redis.call('XREADGROUP', 'GROUP', group, consumer, 'COUNT', want,
      'STREAMS', x, '>')
    if res then
      -- New deliveries are one block: a single record stands for all their leases
      -- (attempt 1, lease id '<block token>:<seq>', one deadline) until each one gets
      -- its own record (settle, renew) or the block expires.
      local entries = res[1][2]
      local first = nil
      for _, e in ipairs(entries) do
        local fl = e[2]
        -- Entry ids are always '<seq>-0'.
        local sq = string.sub(e[1], 1, -3)
        if not first then first = sq end
        items[#items + 1] = '[' .. sq .. ',1,' .. fl[6] .. ',' .. fl[2] .. ']'
        datas[#datas + 1] = fl[4]
        c = tonumber(sq)
      end
      if first then
        redis.call('HSET', B, btoken, first .. '|' .. S(c) .. '|' .. sdl)
        redis.call('ZADD', Y, sdl, btoken)
        redis.call('HSET', G, 'c', S(c))
      end
    end
  end
  if #hs > 0 then bulk({'HSET', D}, hs) end
  if #dead > 0 then
    bulk({'ZADD', R}, radd)
    bulk({'XACK', x, group}, dead)
  end
  if front then redis.call('HSET', G, 'f', S(advance(D, f))) end
end
local left = redis.call('ZCOUNT', Z, '-inf', snow)
if hw > c then left = left + hw - c end
datas[1] = '[' .. S(hw) .. ',' .. S(left) .. ',' .. sdl .. ',' .. S(redelivered) .. ',['
  .. table.concat(items, ',') .. ']]'
return datas
"""

_FIND = r"""
local x, m, G, D, Z, R, B, Y = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6], KEYS[7],
  KEYS[8]
local BY = {a = 'K', n = 'N', r = 'J'}
BY['-'] = 'X'
-- The record of each leased sequence. A delivery without a record of its own that a
-- block covers is leased by the block lease (listed in `virt`: not in Z, nothing in D)
-- past the frontier `f`, acked by it at or behind.
local function lookup(leases, f)
  local hw = tonumber(redis.call('HGET', m, 'hw') or '0')
  local fields = {}
  for k, l in ipairs(leases) do fields[k] = S(l[1]) end
  local cur = hmget(D, fields)
  local state, virt, blocks = {}, {}, {}
  for k, sq in ipairs(fields) do
    if state[sq] == nil then
      local r = cur[k]
      local lid = leases[k][3]
      if not r and type(lid) == 'string' then
        local pos = string.find(lid, ':', 1, true)
        if pos then
          local t = string.sub(lid, 1, pos - 1)
          local b = blocks[t]
          if b == nil then
            b = false
            local spec = redis.call('HGET', B, t)
            if spec then
              local first, last = string.match(spec, '^(%d+)|(%d+)|')
              b = {tonumber(first), tonumber(last)}
            end
            blocks[t] = b
          end
          local n = leases[k][1]
          if b and n >= b[1] and n <= b[2] and lid == t .. ':' .. sq then
            if n <= f then
              r = 'K|1|' .. lid .. '|a||'
            else
              r = 'L|1|' .. lid .. '|||'
              virt[sq] = true
            end
          end
        end
      end
      state[sq] = r
    end
  end
  return hw, fields, state, virt, blocks
end
-- The code of a lease that names nothing current, or nil with the parsed record.
local function check(l, r, hw)
  local seq = l[1]
  if not r then
    if seq >= 1 and seq <= hw then return 'P' end
    return 'Q'
  end
  local st, att, lid, by, _, _, err = parse(r)
  if lid ~= l[3] then return 'S' end
  if l[2] ~= eid(seq) then return 'M' end
  return nil, st, att, lid, by, err
end
"""

# KEYS: x, m, G, D, Z, R, B, Y. ARGV: group, op (a|n|r), reason (then NUL and the error
# to record, if any), delay_ms,
# JSON [[seq, receipt, lease_id, attempt], ...]. Returns one code letter per lease (see
# redis.py). The attempt only serves the fast path: a lease whose record is exactly
# 'L|attempt|lease_id|||' and whose receipt is its entry id is current, with no parsing.
# An ack may add the run form of the same leases: block token t, first, last: the
# leases are exactly '<t>:<seq>' with receipt '<seq>-0' for every seq of first..last,
# in order (the client checked those forms; the script checks the state and falls back
# to the JSON when the run is not the frontier's next one).
SETTLE = r"""
local group, op, reason, delay = ARGV[1], ARGV[2], ARGV[3], tonumber(ARGV[4])
local given = nil
local cut = string.find(reason, '\0', 1, true)
if cut then
  given = string.sub(reason, cut + 1)
  reason = string.sub(reason, 1, cut - 1)
end
local g = redis.call('HMGET', G, 'f', 'ma')
if g[1] and ARGV[6] and op == 'a' then
  -- The run form (see above): every lease of the run is current exactly when its block
  -- covers it, the frontier is right before it and none of its deliveries has a
  -- record of its own. Then the ack moves the frontier over it and writes no record.
  local f = tonumber(g[1])
  local first, last = tonumber(ARGV[7]), tonumber(ARGV[8])
  local spec = first == f + 1 and redis.call('HGET', B, ARGV[6])
  if spec then
    local bf, bl = blockspec(spec)
    local own = false
    if first >= bf and last <= bl and redis.call('HLEN', D) > 0 then
      local fields = {}
      for n = first, last do fields[#fields + 1] = S(n) end
      for _, r in ipairs(hmget(D, fields)) do
        if r then own = true break end
      end
    end
    if first >= bf and last <= bl and not own then
      local ids = {}
      for n = first, last do ids[#ids + 1] = eid(n) end
      bulk({'XACK', x, group}, ids)
      local nf = advance(D, last)
      redis.call('HSET', G, 'f', S(nf))
      -- A block wholly behind the frontier has nothing left to expire.
      if bl <= nf then redis.call('ZREM', Y, ARGV[6]) end
      return string.rep('o', last - first + 1)
    end
  end
end
local leases = cjson.decode(ARGV[5])
if not g[1] then return string.rep('I', #leases) end
local f, ma = tonumber(g[1]), tonumber(g[2])
local now = now_ms()
local snow = S(now)
local hw, fields, state, virt, blocks = lookup(leases, f)
local codes, dirty, zrem, zadd, radd, acks, vacks = {}, {}, {}, {}, {}, {}, {}
local front = false
for k, l in ipairs(leases) do
  local sq = fields[k]
  local cur = state[sq]
  local code, st, att, lid, by, err
  local a = l[4]
  if virt[sq] and l[2] == sq .. '-0' then
    st, att, lid = 'L', 1, l[3]
  elseif cur and type(a) == 'number' and a % 1 == 0 and type(l[3]) == 'string'
      and cur == 'L|' .. S(a) .. '|' .. l[3] .. '|||' and l[2] == sq .. '-0' then
    st, att, lid = 'L', a, l[3]
  else
    code, st, att, lid, by, err = check(l, cur, hw)
  end
  if given then err = given end
  if not code then
    if st ~= 'L' then
      if by == op then code = 'r' else code = BY[by] or 'X' end
    else
      code = 'o'
      local r
      local terminal = true
      if op == 'a' then
        r = 'K|' .. S(att) .. '|' .. lid .. '|a||'
      elseif op == 'r' then
        r = rec('R', att, lid, 'r', snow, reason, err)
      elseif att >= ma then
        r = rec('R', att, lid, 'n', snow, 'max_attempts', err)
      else
        r = rec('A', att, lid, 'n', '', '', err)
        terminal = false
        zadd[#zadd + 1] = S(now + delay)
        zadd[#zadd + 1] = sq
      end
      if terminal then
        if not virt[sq] then zrem[#zrem + 1] = sq end
        acks[#acks + 1] = sq .. '-0'
        if op ~= 'a' then
          radd[#radd + 1] = sq
          radd[#radd + 1] = sq
        end
        if l[1] == f + 1 then front = true end
      end
      state[sq] = r
      if virt[sq] and op == 'a' then
        -- Written below only if the frontier does not pass it.
        vacks[#vacks + 1] = l
      else
        dirty[#dirty + 1] = sq
        dirty[#dirty + 1] = r
      end
      virt[sq] = nil
    end
  end
  codes[k] = code
end
local nf = f
if front then
  -- This batch's records first (D may hold older ones for them), then D's.
  while true do
    local r = state[S(nf + 1)]
    if r then
      local b = string.byte(r, 1)
      if b ~= 75 and b ~= 82 then break end
      nf = nf + 1
    else
      local before = nf
      nf = advance(D, nf)
      if nf == before then break end
    end
  end
end
for _, l in ipairs(vacks) do
  if l[1] > nf then
    local sq = S(l[1])
    dirty[#dirty + 1] = sq
    dirty[#dirty + 1] = state[sq]
  end
end
if #dirty > 0 then bulk({'HSET', D}, dirty) end
if #zrem > 0 then bulk({'ZREM', Z}, zrem) end
if #zadd > 0 then bulk({'ZADD', Z}, zadd) end
if #radd > 0 then bulk({'ZADD', R}, radd) end
if #acks > 0 then bulk({'XACK', x, group}, acks) end
if nf > f then
  redis.call('HSET', G, 'f', S(nf))
  -- A block wholly behind the frontier has nothing left to expire.
  local done = {}
  for t, b in pairs(blocks) do
    if b and b[2] <= nf then done[#done + 1] = t end
  end
  if #done > 0 then bulk({'ZREM', Y}, done) end
end
return table.concat(codes)
"""

# KEYS: x, m, G, D, Z, R. ARGV: group, lease_ms, JSON [[seq, receipt, lease_id, consumer]].
# Returns "deadline:codes".
RENEW = r"""
local group, lease_ms = ARGV[1], tonumber(ARGV[2])
local leases = cjson.decode(ARGV[3])
local now = now_ms()
local sdl = S(now + lease_ms)
local g = redis.call('HMGET', G, 'f')
if not g[1] then return sdl .. ':' .. string.rep('I', #leases) end
local hw, fields, state, virt = lookup(leases, tonumber(g[1]))
local codes, zadd, owners, hs = {}, {}, {}, {}
for k, l in ipairs(leases) do
  local sq = fields[k]
  local code, st, att, lid, by = check(l, state[sq], hw)
  if not code then
    if st ~= 'L' then
      code = BY[by] or 'X'
    else
      code = 'o'
      zadd[#zadd + 1] = sdl
      zadd[#zadd + 1] = sq
      if virt[sq] then
        -- Leaves its block: its own record and deadline from now on.
        virt[sq] = nil
        hs[#hs + 1] = sq
        hs[#hs + 1] = state[sq]
      end
      -- Reset the PEL idle time of our own leases (observability: XPENDING).
      local owner = tostring(l[4])
      if not owners[owner] then owners[owner] = {} end
      local ids = owners[owner]
      ids[#ids + 1] = sq .. '-0'
    end
  end
  codes[k] = code
end
if #zadd > 0 then
  if #hs > 0 then bulk({'HSET', D}, hs) end
  bulk({'ZADD', Z}, zadd)
  for owner, ids in pairs(owners) do
    bulk({'XCLAIM', x, group, owner, '0'}, ids)
  end
end
return sdl .. ':' .. table.concat(codes)
"""

# KEYS: x, m, G, D, Z, R. ARGV: group, from_sequence.
REPLAY = r"""
local x, m, G, D, Z, R, B, Y = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6], KEYS[7],
  KEYS[8]
local group = ARGV[1]
local g = redis.call('HMGET', G, 'f', 'c')
if not g[1] then return 'NOGROUP' end
local f, c = tonumber(g[1]), tonumber(g[2])
local lw = tonumber(redis.call('HGET', m, 'lw') or '1')
-- Trimmed events are gone and count as settled: replay starts at the low water.
local start = math.max(tonumber(ARGV[2]), lw)
if start <= c then
  -- What stays of a block is behind the new frontier exactly when it was behind the old.
  clip(B, Y, 0, start - 1)
  local active = redis.call('ZRANGE', Z, 0, -1)
  local zr, acks = {}, {}
  for _, sq in ipairs(active) do
    if tonumber(sq) >= start then
      zr[#zr + 1] = sq
      acks[#acks + 1] = sq .. '-0'
    end
  end
  if #zr > 0 then
    bulk({'ZREM', Z}, zr)
    bulk({'XACK', x, group}, acks)
  end
  if start <= lw then
    redis.call('DEL', D)
  else
    local dels = {}
    for s = start, c do
      dels[#dels + 1] = S(s)
      if #dels >= CHUNK then
        redis.call('HDEL', D, unpack(dels))
        dels = {}
      end
    end
    if #dels > 0 then redis.call('HDEL', D, unpack(dels)) end
  end
  redis.call('ZREMRANGEBYSCORE', R, start, '+inf')
  c = start - 1
  redis.call('XGROUP', 'SETID', x, group, eid(c))
end
if f > start - 1 then f = start - 1 end
redis.call('HSET', G, 'f', S(f), 'c', S(c))
return 'OK'
"""

# KEYS: x, m, G, D, Z, R. ARGV: group, position spec.
RESET = r"""
local x, m, G, D, Z, R, B, Y = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6], KEYS[7],
  KEYS[8]
local group = ARGV[1]
if redis.call('EXISTS', G) == 0 then return 'NOGROUP' end
local mm = redis.call('HMGET', m, 'hw', 'lw')
local pos = resolve(ARGV[2], tonumber(mm[1] or '0'), tonumber(mm[2] or '1'))
redis.call('DEL', D, Z, R, B, Y)
-- Recreating the consumer group drops its pending entries and consumers.
redis.pcall('XGROUP', 'DESTROY', x, group)
redis.call('XGROUP', 'CREATE', x, group, eid(pos), 'MKSTREAM')
redis.call('HSET', G, 'f', S(pos), 'c', S(pos))
return 'OK'
"""

# KEYS: x, m, i, then G, D, Z, R, B, Y of each group. ARGV: bound, chunk, want ids (1|0), groups...
# Removes at most `chunk` events. Returns JSON [removed, more_to_do, [ids]].
TRIM = r"""
local x, m, i = KEYS[1], KEYS[2], KEYS[3]
local mm = redis.call('HMGET', m, 'hw', 'lw')
local hw, lw = tonumber(mm[1] or '0'), tonumber(mm[2] or '1')
local bound = math.min(tonumber(ARGV[1]), hw)
if bound < lw then return '[0,0,[]]' end
local stop = math.min(bound, lw + tonumber(ARGV[2]) - 1)
local entries = redis.call('XRANGE', x, eid(lw), eid(stop))
local ids = {}
for k, e in ipairs(entries) do
  local fl = e[2]
  local ok, meta = pcall(cjson.decode, fl[2])
  if ok and type(meta) == 'table' then ids[#ids + 1] = meta[1] end
end
if #ids > 0 then bulk({'HDEL', i}, ids) end
redis.call('XTRIM', x, 'MINID', eid(stop + 1))
redis.call('HSET', m, 'lw', S(stop + 1))
local ngroups = #ARGV - 3
for gi = 1, ngroups do
  local base = 3 + (gi - 1) * 6
  local G, D, Z, R = KEYS[base + 1], KEYS[base + 2], KEYS[base + 3], KEYS[base + 4]
  local B, Y = KEYS[base + 5], KEYS[base + 6]
  local group = ARGV[3 + gi]
  local g = redis.call('HMGET', G, 'f', 'c')
  if g[1] then
    clip(B, Y, stop + 1, math.huge)
    local f, c = tonumber(g[1]), tonumber(g[2])
    local dels = {}
    for s = lw, math.min(stop, c) do dels[#dels + 1] = S(s) end
    if #dels > 0 then bulk({'HDEL', D}, dels) end
    local active = redis.call('ZRANGE', Z, 0, -1)
    local zr, acks = {}, {}
    for _, sq in ipairs(active) do
      if tonumber(sq) <= stop then
        zr[#zr + 1] = sq
        acks[#acks + 1] = sq .. '-0'
      end
    end
    if #zr > 0 then
      bulk({'ZREM', Z}, zr)
      bulk({'XACK', x, group}, acks)
    end
    redis.call('ZREMRANGEBYSCORE', R, '-inf', stop)
    if c < stop then
      c = stop
      redis.call('XGROUP', 'SETID', x, group, eid(c))
    end
    if f < stop then f = stop end
    f = advance(D, f)
    redis.call('HSET', G, 'f', S(f), 'c', S(c))
  end
end
local more = 0
if stop < bound then more = 1 end
local listed = '[]'
if ARGV[3] == '1' and #ids > 0 then listed = cjson.encode(ids) end
return '[' .. S(#entries) .. ',' .. more .. ',' .. listed .. ']'
"""

# KEYS: x, D, R. ARGV: after sequence, limit.
# Returns JSON [[seq, attempts, rejected_at, reason, meta, last error or null], ...].
DEAD_LETTERS = r"""
local x, D, R = KEYS[1], KEYS[2], KEYS[3]
local seqs = redis.call('ZRANGEBYSCORE', R, '(' .. ARGV[1], '+inf', 'LIMIT', 0, tonumber(ARGV[2]))
if #seqs == 0 then return '[]' end
local recs = hmget(D, seqs)
local out = {}
for k, sq in ipairs(seqs) do
  local r = recs[k]
  if r then
    local st, att, lid, by, at, reason, err = parse(r)
    local e = redis.call('XRANGE', x, sq .. '-0', sq .. '-0')
    if st == 'R' and e[1] then
      out[#out + 1] = '[' .. sq .. ',' .. S(att) .. ',' .. at .. ',' .. cjson.encode(reason)
        .. ',' .. e[1][2][2] .. ',' .. (err and cjson.encode(err) or 'null') .. ']'
    end
  end
end
return '[' .. table.concat(out, ',') .. ']'
"""

# KEYS: G, D, Z, R, B. ARGV: 'all' or JSON [seq, ...]. Returns how many were re-driven.
REDRIVE = r"""
local G, D, Z, R, B = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local g = redis.call('HMGET', G, 'f')
if not g[1] then return -1 end
local f = tonumber(g[1])
local seqs
if ARGV[1] == 'all' then
  seqs = redis.call('ZRANGE', R, 0, -1)
else
  seqs = {}
  for _, s in ipairs(cjson.decode(ARGV[1])) do
    local sq = S(s)
    if redis.call('ZSCORE', R, sq) then seqs[#seqs + 1] = sq end
  end
end
if #seqs == 0 then return 0 end
local snow = S(now_ms())
local hs, za = {}, {}
local low = nil
local seen = {}
for _, sq in ipairs(seqs) do
  if not seen[sq] then
    seen[sq] = true
    hs[#hs + 1] = sq
    hs[#hs + 1] = 'A|0||||'
    za[#za + 1] = snow
    za[#za + 1] = sq
    local n = tonumber(sq)
    if not low or n < low then low = n end
  end
end
bulk({'HSET', D}, hs)
bulk({'ZADD', Z}, za)
local members = {}
for k = 2, #za, 2 do members[#members + 1] = za[k] end
bulk({'ZREM', R}, members)
if f > low - 1 then
  own_acks(D, B, low, f)
  redis.call('HSET', G, 'f', S(low - 1))
end
return #members
"""

# KEYS: x. ARGV: group, consumer names... Deletes the named Redis consumers that hold
# nothing (consumer ids are per process: without this they pile up in XINFO CONSUMERS).
FORGET_CONSUMERS = r"""
local info = redis.pcall('XINFO', 'CONSUMERS', KEYS[1], ARGV[1])
if type(info) ~= 'table' or info.err then return 0 end
local wanted = {}
for k = 2, #ARGV do wanted[ARGV[k]] = true end
local n = 0
for _, c in ipairs(info) do
  local name, pending
  for k = 1, #c, 2 do
    if c[k] == 'name' then name = c[k + 1] elseif c[k] == 'pending' then pending = c[k + 1] end
  end
  if name and wanted[name] and pending == 0 then
    redis.call('XGROUP', 'DELCONSUMER', KEYS[1], ARGV[1], name)
    n = n + 1
  end
end
return n
"""

SCRIPTS: dict[str, str] = {
    "create_stream": _COMMON + CREATE_STREAM,
    "group_record": _COMMON + GROUP_RECORD,
    "init_group": _COMMON + INIT_GROUP,
    "claim_ids": _COMMON + CLAIM_IDS,
    "append": _COMMON + APPEND,
    "fetch": _COMMON + FETCH,
    "settle": _COMMON + _FIND + SETTLE,
    "renew": _COMMON + _FIND + RENEW,
    "replay": _COMMON + REPLAY,
    "reset": _COMMON + RESET,
    "trim": _COMMON + TRIM,
    "dead_letters": _COMMON + DEAD_LETTERS,
    "redrive": _COMMON + REDRIVE,
    "forget_consumers": _COMMON + FORGET_CONSUMERS,
}
"""Script name -> Lua source (each with the shared helpers prepended)."""
