-- Helpers every script starts with (prepended by _scripts.py): the server clock, number
-- formats, chunked variadic commands, delivery records and blocks (formats: _scripts.py).
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
-- The hash fields of the sequences a..b.
local function seq_fields(a, b)
  local out = {}
  for s = a, b do out[#out + 1] = S(s) end
  return out
end
-- HDEL the fields of the sequences a..b, a chunk at a time (the range may be long).
local function hdel_range(H, a, b)
  local fields = {}
  for s = a, b do
    fields[#fields + 1] = S(s)
    if #fields >= CHUNK then
      redis.call('HDEL', H, unpack(fields))
      fields = {}
    end
  end
  if #fields > 0 then redis.call('HDEL', H, unpack(fields)) end
end
-- The sequences a..b (as fields) that have no delivery record of their own in D.
local function unrecorded(D, a, b)
  local fields = seq_fields(a, b)
  local cur = hmget(D, fields)
  local out = {}
  for i, sq in ipairs(fields) do
    if not cur[i] then out[#out + 1] = sq end
  end
  return out
end
-- The available and leased deliveries of the sequences a..b leave Z and the PEL.
local function drop_active(x, group, Z, a, b)
  local zr, acks = {}, {}
  for _, sq in ipairs(redis.call('ZRANGE', Z, 0, -1)) do
    local n = tonumber(sq)
    if n >= a and n <= b then
      zr[#zr + 1] = sq
      acks[#acks + 1] = sq .. '-0'
    end
  end
  if #zr > 0 then
    bulk({'ZREM', Z}, zr)
    bulk({'XACK', x, group}, acks)
  end
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
-- A block record: first and last sequence, deadline (as text).
local function blockspec(spec)
  local first, last, dl = string.match(spec, '^(%d+)|(%d+)|(%d+)$')
  return tonumber(first), tonumber(last), dl
end
-- Key-ordered groups (field 'o' = 'k' of G). K: each key with an unsettled delivery ->
-- 'head|tail', the unsettled (leased, waiting or parked) one and the last delivery of
-- the key the cursor passed; N: each delivery of a blocked key the cursor passed over
-- (no record, neither in Z nor in the PEL, not leased by a block whose range it is in)
-- -> the next one of its key, so a key's deferred deliveries are a linked list from its
-- head to its tail. A materialised delivery that is not its key's head (only after a
-- redrive) waits in Z at score PARK; a leased one has a record of its own then.
local PARK = 4000000000000000
-- The key of a stream entry's fields (nil when it has none). Meta is JSON [id, type, key,
-- headers]: when neither of the three strings holds an escape, one match finds the key.
local function entry_key(fl)
  local plain = string.match(fl[2], '^%["[^"\\]*","[^"\\]*","([^"\\]*)",')
  if plain then return plain end
  local ok, meta = pcall(cjson.decode, fl[2])
  if ok and type(meta) == 'table' and type(meta[3]) == 'string' then return meta[3] end
  return nil
end
-- The key of the event with sequence sq (text), read from the stream (nil: none or gone).
local function seq_key(x, sq)
  local e = redis.call('XRANGE', x, sq .. '-0', sq .. '-0')
  if e[1] then return entry_key(e[1][2]) end
  return nil
end
local function keyspec(spec)
  return string.match(spec, '^(%d+)|(%d+)$')
end
-- Of the sequences sqs (text, ascending) of a key-ordered group's block without a
-- record of their own, those the block leased: the keyless ones and their key's heads
-- (an entry gone from the stream stays in, as in any group).
local function block_leased(x, K, sqs)
  local keys = {}
  for _, e in ipairs(redis.call('XRANGE', x, sqs[1] .. '-0', sqs[#sqs] .. '-0')) do
    keys[string.sub(e[1], 1, -3)] = entry_key(e[2]) or false
  end
  local out = {}
  for _, sq in ipairs(sqs) do
    local k = keys[sq]
    local spec = k and redis.call('HGET', K, k)
    if not spec or keyspec(spec) == sq then out[#out + 1] = sq end
  end
  return out
end
-- Expired blocks: their entries past the frontier without a record of their own get one
-- ('L', due at the block's deadline); the part at or behind the frontier stays. In a
-- key-ordered group (x and K given) such an entry that is not keyless nor its key's head
-- was passed over, not leased (see fetch.lua): it stays as it is.
local function expire(D, Z, B, Y, tokens, f, x, K)
  if #tokens == 0 then return end
  local specs = hmget(B, tokens)
  local gone = {}
  for k, t in ipairs(tokens) do
    local spec = specs[k]
    if spec then
      local first, last, dl = blockspec(spec)
      if last > f then
        local hs, za = {}, {}
        local sqs = unrecorded(D, math.max(first, f + 1), last)
        if x and #sqs > 0 then sqs = block_leased(x, K, sqs) end
        for _, sq in ipairs(sqs) do
          hs[#hs + 1] = sq
          hs[#hs + 1] = 'L|1|' .. t .. ':' .. sq .. '|||'
          za[#za + 1] = dl
          za[#za + 1] = sq
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
      local hs = {}
      for _, sq in ipairs(unrecorded(D, a, b)) do
        hs[#hs + 1] = sq
        hs[#hs + 1] = 'K|1|' .. all[k] .. ':' .. sq .. '|a||'
      end
      if #hs > 0 then bulk({'HSET', D}, hs) end
    end
  end
end
-- The position a start spec ('earliest', 'latest' or a sequence) names, within the stream.
local function resolve(spec, hw, lw)
  local pos
  if spec == 'earliest' then pos = 0
  elseif spec == 'latest' then pos = hw
  else pos = tonumber(spec) end
  if pos > hw then pos = hw end
  if pos < lw - 1 then pos = lw - 1 end
  return pos
end
-- The head of key k is settled or gone: the next delivery of k neither settled nor at or
-- below `stop` becomes its head (due now if it was passed over or parked); none: k is free.
-- Returns true when it made a delivery due now.
local function pass_key(K, N, D, Z, k, head, tail, stop, snow)
  local nxt = head
  while nxt ~= tail do
    local after = redis.call('HGET', N, nxt)
    redis.call('HDEL', N, nxt)
    if not after then break end
    nxt = after
    if tonumber(nxt) > stop then
      local r = redis.call('HGET', D, nxt)
      local b = r and string.byte(r, 1)
      local due = not r
      if not r then
        redis.call('HSET', D, nxt, 'A|0||||')
        redis.call('ZADD', Z, snow, nxt)
      elseif b ~= 75 and b ~= 82 then
        local sc = redis.call('ZSCORE', Z, nxt)
        if sc and tonumber(sc) >= PARK then
          redis.call('ZADD', Z, snow, nxt)
          due = true
        end
      end
      if not r or (b ~= 75 and b ~= 82) then
        redis.call('HSET', K, k, nxt .. '|' .. tail)
        return due
      end
    end
  end
  redis.call('HDEL', K, k)
  return false
end
-- The delivery sq (text) of key k is settled for good: it releases k if it is k's head.
-- Returns true when that made the next delivery of k due now.
local function release(K, N, D, Z, k, sq, snow)
  if type(k) ~= 'string' then return false end
  local spec = redis.call('HGET', K, k)
  if not spec then return false end
  local head, tail = keyspec(spec)
  return head == sq and pass_key(K, N, D, Z, k, head, tail, 0, snow)
end
