-- KEYS: x, m, G, D, Z, R, B, Y, K, N. ARGV: group, consumer, quota, lease_ms, lease id prefix,
-- block token. Returns LOST, 'NOGROUP', 'AGAIN' (this call already ran: its answer was lost)
-- or an array: JSON [high_water, still_available, deadline, redelivered,
-- [[seq, attempt, time, meta], ...], more, first, last, cursor], then the data (JSON text)
-- of each item; more is 1 when a key-ordered group's scan stopped at its budget short of
-- the quota (call again: the events it passed over belonged to blocked keys).
-- The first `redelivered` items have lease ids prefix .. 1, 2, ..., the new deliveries
-- after them '<block token>:<seq>'. An unordered group's new deliveries are not items:
-- they are the range first..last (0..0: none), leased by the block without being read
-- here, and cursor is where the group's cursor is now (-1 for a key-ordered group). The
-- client reads them with XRANGE: a stream's entries never change, so that read may run
-- before or after this call.
local x, m, G, D, Z, R, B, Y, K, N = unpack(KEYS, 1, 10)
local group, consumer, token, btoken = ARGV[1], ARGV[2], ARGV[5], ARGV[6]
local quota, lease_ms = tonumber(ARGV[3]), tonumber(ARGV[4])
local mm = redis.call('HMGET', m, 'hw', 'mk')
if not mm[2] then return 'LOST' end
local g = redis.call('HMGET', G, 'f', 'c', 'ma', 'o')
if not g[1] then return 'NOGROUP' end
-- The same call run again (the client resent it after its answer was lost): the
-- first run's block keeps its leases until they expire; granting more under the
-- same token would overwrite that block and strand its deliveries for ever.
if redis.call('HEXISTS', B, btoken) == 1 then return 'AGAIN' end
local f, c, ma = tonumber(g[1]), tonumber(g[2]), tonumber(g[3])
-- A key-ordered group: the events of blocked keys are passed over (see keyed_new).
local keyed = g[4] == 'k'
local hw = tonumber(mm[1] or '0')
local now = now_ms()
local snow = S(now)
local sdl = S(now + lease_ms)
local items = {}
-- The reply: the JSON head, then the data of each item as stored (no re-encoding).
local datas = {''}
local redelivered = 0
local more = 0
-- The range of an unordered group's new deliveries (see plain_new).
local range = '0,0'
-- Blocks past their deadline become per-delivery records, found below like any other.
expire(D, Z, B, Y, redis.call('ZRANGEBYSCORE', Y, '-inf', snow), f, keyed and x, K)
-- A new delivery (sequence sq, as text, and the entry's fields) goes into the reply.
local function new_item(sq, fl)
  items[#items + 1] = '[' .. sq .. ',1,' .. fl[6] .. ',' .. fl[2] .. ']'
  datas[#datas + 1] = fl[4]
end
-- New deliveries of an unordered group: the next `want` entries past the cursor, leased
-- as one range and not read (every entry c + 1..hw is there: trim raises c to its bound).
-- They do not enter the consumer group's PEL; its last id follows the cursor all the
-- same (XREADGROUP '>' of a key-ordered group, or of an older release, starts there).
-- Returns the first and last sequence and the new cursor.
local function plain_new(want)
  local last = math.min(c + want, hw)
  redis.call('XGROUP', 'SETID', x, group, eid(last))
  return S(c + 1), S(last), last
end
-- New deliveries of a key-ordered group: the events of keyless and free keys are leased
-- as in any group; those of blocked keys are passed over: linked behind their key's tail
-- in N, with no record, neither in Z nor in the PEL. The first read is XREADGROUP of
-- `want` entries, which is all it takes unless some were passed over; then XRANGE reads
-- on (the leased ones XCLAIMed into the PEL, the group's cursor set after), at most
-- want + 1000 events in all (`more` set when that stopped it). Returns the first and
-- last sequence leased (nil: none) and the new cursor.
local function keyed_new(want)
  local budget = want + 1000
  local known, ks, links, over, claim = {}, {}, {}, {}, {}
  local first, last = nil, nil
  local pos = c
  -- The entries in order, until `want` are leased; pel: they are in the PEL already.
  local function take(entries, pel)
    local keys, ask = {}, {}
    for i, e in ipairs(entries) do
      local k = entry_key(e[2])
      keys[i] = k
      if k and known[k] == nil then
        known[k] = false
        ask[#ask + 1] = k
      end
    end
    if #ask > 0 then
      local specs = hmget(K, ask)
      for i, k in ipairs(ask) do known[k] = specs[i] end
    end
    local done, sq = 0, nil
    for i, e in ipairs(entries) do
      if want == 0 then break end
      sq = string.sub(e[1], 1, -3)
      done = i
      local k = keys[i]
      local spec = k and known[k]
      if spec then
        local head, tail = keyspec(spec)
        links[#links + 1] = tail
        links[#links + 1] = sq
        spec = head .. '|' .. sq
        if pel then over[#over + 1] = e[1] end
      else
        spec = sq .. '|' .. sq
        want = want - 1
        new_item(sq, e[2])
        if not first then first = sq end
        last = sq
        if not pel then claim[#claim + 1] = e[1] end
      end
      if k then
        -- HSET K below: a key set twice keeps its last spec.
        known[k] = spec
        ks[#ks + 1] = k
        ks[#ks + 1] = spec
      end
    end
    if sq then pos = tonumber(sq) end
    budget = budget - done
  end
  local res = redis.call('XREADGROUP', 'GROUP', group, consumer, 'COUNT', want,
    'STREAMS', x, '>')
  if res then take(res[1][2], true) end
  local read = pos
  while want > 0 and pos < hw and budget > 0 do
    local entries = redis.call('XRANGE', x, '(' .. eid(pos), '+', 'COUNT',
      math.min(math.max(want, 64), budget))
    if #entries == 0 then break end
    take(entries, false)
  end
  if #links > 0 then bulk({'HSET', N}, links) end
  if #ks > 0 then bulk({'HSET', K}, ks) end
  if #over > 0 then bulk({'XACK', x, group}, over) end
  if pos > read then redis.call('XGROUP', 'SETID', x, group, eid(pos)) end
  local i = 1
  while i <= #claim do
    local j = math.min(i + CHUNK - 1, #claim)
    local args = {'XCLAIM', x, group, consumer, '0'}
    for k = i, j do args[#args + 1] = claim[k] end
    args[#args + 1] = 'FORCE'
    args[#args + 1] = 'JUSTID'
    redis.call(unpack(args))
    i = j + 1
  end
  if want > 0 and pos < hw and budget <= 0 then more = 1 end
  return first, last, pos
end
if quota > 0 then
  local hs, dead, radd, due, next_att, errs = {}, {}, {}, {}, {}, {}
  local freed, park = {}, {}
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
          if keyed then freed[#freed + 1] = sq end
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
      local head = nil
      if fl and keyed then
        -- Only the head of its key may be leased (another one waits parked).
        local k = entry_key(fl)
        local spec = k and redis.call('HGET', K, k)
        if spec then head = keyspec(spec) end
      end
      if head and head ~= sq then
        park[#park + 1] = S(PARK)
        park[#park + 1] = sq
      elseif fl then
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
  if #park > 0 then bulk({'ZADD', Z}, park) end
  redelivered = n
  -- New deliveries past the group's cursor are one block: a single record stands for
  -- all their leases (attempt 1, lease id '<block token>:<seq>', one deadline) until
  -- each one gets its own record (settle, renew) or the block expires.
  local want = quota - n
  if want > 0 and c < hw then
    local first, last, nc
    if keyed then
      first, last, nc = keyed_new(want)
    else
      first, last, nc = plain_new(want)
      range = first .. ',' .. last
    end
    if first then
      redis.call('HSET', B, btoken, first .. '|' .. last .. '|' .. sdl)
      redis.call('ZADD', Y, sdl, btoken)
    end
    if nc > c then
      c = nc
      redis.call('HSET', G, 'c', S(c))
    end
  end
  if #hs > 0 then bulk({'HSET', D}, hs) end
  if #dead > 0 then
    bulk({'ZADD', R}, radd)
    bulk({'XACK', x, group}, dead)
  end
  if front then redis.call('HSET', G, 'f', S(advance(D, f))) end
  -- Dead-lettered heads release their keys (the next delivery is due from now on).
  for _, sq in ipairs(freed) do release(K, N, D, Z, seq_key(x, sq), sq, snow) end
end
local left = redis.call('ZCOUNT', Z, '-inf', snow)
if hw > c then left = left + hw - c end
datas[1] = '[' .. S(hw) .. ',' .. S(left) .. ',' .. sdl .. ',' .. S(redelivered) .. ',['
  .. table.concat(items, ',') .. '],' .. S(more) .. ',' .. range .. ',' .. S(keyed and -1 or c)
  .. ']'
return datas
