-- KEYS: x, m, G, D, Z, R, B, Y. ARGV: group, consumer, quota, lease_ms, lease id prefix,
-- block token. Returns LOST, 'NOGROUP', 'AGAIN' (this call already ran: its answer was lost)
-- or an array: JSON [high_water, still_available, deadline,
-- redelivered, [[seq, attempt, time, meta], ...]], then the data (JSON text) of each item.
-- The first `redelivered` items have lease ids
-- prefix .. 1, 2, ..., the new deliveries after them '<block token>:<seq>'.
local x, m, G, D, Z, R, B, Y = unpack(KEYS, 1, 8)
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
