-- Helpers every script starts with (prepended by _scripts.py): the server clock, number
-- formats, chunked variadic commands, delivery records and blocks (formats: _scripts.py).
local function now_ms()
  local token = redis.call('TIME')
  return tonumber(token[1]) * 1000 + math.floor(tonumber(token[2]) / 1000)
end
local function int_text(n) return string.format('%d', n) end
local function entry_id(n) return string.format('%d-0', n) end
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
  for s = a, b do out[#out + 1] = int_text(s) end
  return out
end
-- HDEL the fields of the sequences a..b, a chunk at a time (the range may be long).
local function hdel_range(H, a, b)
  local fields = {}
  for s = a, b do
    fields[#fields + 1] = int_text(s)
    if #fields >= CHUNK then
      redis.call('HDEL', H, unpack(fields))
      fields = {}
    end
  end
  if #fields > 0 then redis.call('HDEL', H, unpack(fields)) end
end
-- The sequences a..b (as fields) that have no delivery record of their own in D.
local function unrecorded(records_key, a, b)
  local fields = seq_fields(a, b)
  local stored = hmget(records_key, fields)
  local out = {}
  for i, seq_text in ipairs(fields) do
    if not stored[i] then out[#out + 1] = seq_text end
  end
  return out
end
-- The available and leased deliveries of the sequences a..b leave Z and the PEL.
local function drop_active(stream_key, group, due_key, a, b)
  local due_removes, pel_acks = {}, {}
  for _, seq_text in ipairs(redis.call('ZRANGE', due_key, 0, -1)) do
    local n = tonumber(seq_text)
    if n >= a and n <= b then
      due_removes[#due_removes + 1] = seq_text
      pel_acks[#pel_acks + 1] = seq_text .. '-0'
    end
  end
  if #due_removes > 0 then
    bulk({'ZREM', due_key}, due_removes)
    bulk({'XACK', stream_key, group}, pel_acks)
  end
end
-- The last error follows the reason after a NUL (absent when none was recorded).
local function parse_record(record)
  local state, attempt, lease_id, settled_by, at, reason =
    string.match(record, '^(%a)|(%d+)|([^|]*)|([^|]*)|([^|]*)|(.*)$')
  local last_error = nil
  local cut = reason and string.find(reason, '\0', 1, true)
  if cut then
    last_error = string.sub(reason, cut + 1)
    reason = string.sub(reason, 1, cut - 1)
  end
  return state, tonumber(attempt), lease_id, settled_by, at, reason, last_error
end
local function record_text(state, attempt, lease_id, settled_by, at, reason, last_error)
  local record = state .. '|' .. int_text(attempt) .. '|' .. lease_id .. '|' .. settled_by .. '|' .. at .. '|' .. reason
  if last_error then record = record .. '\0' .. last_error end
  return record
end
-- Move the frontier over every acked or rejected delivery right after it.
local function advance(records_key, frontier)
  local step = 16
  while true do
    local fields = {}
    for k = 1, step do fields[k] = int_text(frontier + k) end
    local records = redis.call('HMGET', records_key, unpack(fields))
    local moved = 0
    for k = 1, step do
      local record = records[k]
      if not record then break end
      local b = string.byte(record, 1)
      if b ~= 75 and b ~= 82 then break end
      moved = k
    end
    frontier = frontier + moved
    if moved < step then return frontier end
    if step < 1024 then step = step * 2 end
  end
end
-- A block record: first and last sequence, deadline (as text).
local function parse_block(spec)
  local first, last, deadline_text = string.match(spec, '^(%d+)|(%d+)|(%d+)$')
  return tonumber(first), tonumber(last), deadline_text
end
-- Key-ordered groups (field 'o' = 'k' of G). K: each key with an unsettled delivery ->
-- 'head|tail', the unsettled (leased, waiting or parked) one and the last delivery of
-- the key the cursor passed; N: each delivery of a blocked key the cursor passed over
-- (no record, neither in Z nor in the PEL, not leased by a block whose range it is in)
-- -> the next one of its key, so a key's deferred deliveries are a linked list from its
-- head to its tail. A materialised delivery that is not its key's head (only after a
-- redrive) waits in Z at score PARK; a leased one has a record of its own then.
local PARKED_SCORE = 4000000000000000
-- The key of a stream entry's fields (nil when it has none). Meta is JSON [id, type, key,
-- headers]: when neither of the three strings holds an escape, one match finds the key.
local function entry_key(entry_fields)
  local plain = string.match(entry_fields[2], '^%["[^"\\]*","[^"\\]*","([^"\\]*)",')
  if plain then return plain end
  local ok, meta = pcall(cjson.decode, entry_fields[2])
  if ok and type(meta) == 'table' and type(meta[3]) == 'string' then return meta[3] end
  return nil
end
-- The key of the event with sequence sq (text), read from the stream (nil: none or gone).
local function key_of_seq(stream_key, seq_text)
  local e = redis.call('XRANGE', stream_key, seq_text .. '-0', seq_text .. '-0')
  if e[1] then return entry_key(e[1][2]) end
  return nil
end
local function parse_key_span(spec)
  return string.match(spec, '^(%d+)|(%d+)$')
end
-- Of the sequences sqs (text, ascending) of a key-ordered group's block without a
-- record of their own, those the block leased: the keyless ones and their key's heads
-- (an entry gone from the stream stays in, as in any group).
local function block_leased(stream_key, key_spans_key, sqs)
  local keys = {}
  for _, e in ipairs(redis.call('XRANGE', stream_key, sqs[1] .. '-0', sqs[#sqs] .. '-0')) do
    keys[string.sub(e[1], 1, -3)] = entry_key(e[2]) or false
  end
  local out = {}
  for _, seq_text in ipairs(sqs) do
    local k = keys[seq_text]
    local spec = k and redis.call('HGET', key_spans_key, k)
    if not spec or parse_key_span(spec) == seq_text then out[#out + 1] = seq_text end
  end
  return out
end
-- Expired blocks: their entries past the frontier without a record of their own get one
-- ('L', due at the block's deadline); the part at or behind the frontier stays. In a
-- key-ordered group (x and K given) such an entry that is not keyless nor its key's head
-- was passed over, not leased (see fetch.lua): it stays as it is.
local function expire_blocks(records_key, due_key, blocks_key, block_deadlines_key, tokens, frontier, stream_key, key_spans_key)
  if #tokens == 0 then return end
  local specs = hmget(blocks_key, tokens)
  local gone = {}
  for k, token in ipairs(tokens) do
    local spec = specs[k]
    if spec then
      local first, last, deadline_text = parse_block(spec)
      if last > frontier then
        local record_writes, due_adds = {}, {}
        local sqs = unrecorded(records_key, math.max(first, frontier + 1), last)
        if stream_key and #sqs > 0 then sqs = block_leased(stream_key, key_spans_key, sqs) end
        for _, seq_text in ipairs(sqs) do
          record_writes[#record_writes + 1] = seq_text
          record_writes[#record_writes + 1] = 'L|1|' .. token .. ':' .. seq_text .. '|||'
          due_adds[#due_adds + 1] = deadline_text
          due_adds[#due_adds + 1] = seq_text
        end
        if #record_writes > 0 then
          bulk({'HSET', records_key}, record_writes)
          bulk({'ZADD', due_key}, due_adds)
        end
        if first <= frontier then
          redis.call('HSET', blocks_key, token, int_text(first) .. '|' .. int_text(frontier) .. '|' .. deadline_text)
        else
          gone[#gone + 1] = token
        end
      end
    end
  end
  if #gone > 0 then bulk({'HDEL', blocks_key}, gone) end
  bulk({'ZREM', block_deadlines_key}, tokens)
end
-- Every block keeps only its part inside [lo, hi].
local function clip_blocks(blocks_key, block_deadlines_key, low_acked, high_acked)
  local all = redis.call('HGETALL', blocks_key)
  local gone, keep = {}, {}
  for k = 1, #all, 2 do
    local first, last, deadline_text = parse_block(all[k + 1])
    local a, b = math.max(first, low_acked), math.min(last, high_acked)
    if a > b then
      gone[#gone + 1] = all[k]
    elseif a ~= first or b ~= last then
      keep[#keep + 1] = all[k]
      keep[#keep + 1] = int_text(a) .. '|' .. int_text(b) .. '|' .. deadline_text
    end
  end
  if #gone > 0 then
    bulk({'HDEL', blocks_key}, gone)
    bulk({'ZREM', block_deadlines_key}, gone)
  end
  if #keep > 0 then bulk({'HSET', blocks_key}, keep) end
end
-- Before the frontier moves back to lo - 1: the block entries in [lo, hi] (all behind
-- it, so acked by their block lease) get an ack record of their own.
local function own_acks(records_key, blocks_key, low_acked, high_acked)
  local all = redis.call('HGETALL', blocks_key)
  for k = 1, #all, 2 do
    local first, last = parse_block(all[k + 1])
    local a, b = math.max(first, low_acked), math.min(last, high_acked)
    if a <= b then
      local record_writes = {}
      for _, seq_text in ipairs(unrecorded(records_key, a, b)) do
        record_writes[#record_writes + 1] = seq_text
        record_writes[#record_writes + 1] = 'K|1|' .. all[k] .. ':' .. seq_text .. '|a||'
      end
      if #record_writes > 0 then bulk({'HSET', records_key}, record_writes) end
    end
  end
end
-- The position a start spec ('earliest', 'latest' or a sequence) names, within the stream.
local function resolve_start(spec, high_water, low_water)
  local pos
  if spec == 'earliest' then pos = 0
  elseif spec == 'latest' then pos = high_water
  else pos = tonumber(spec) end
  if pos > high_water then pos = high_water end
  if pos < low_water - 1 then pos = low_water - 1 end
  return pos
end
-- The head of key k is settled or gone: the next delivery of k neither settled nor at or
-- below `stop` becomes its head (due now if it was passed over or parked); none: k is free.
-- Returns true when it made a delivery due now.
local function pass_key(key_spans_key, key_next_key, records_key, due_key, k, head, tail, stop, now_text)
  local nxt = head
  while nxt ~= tail do
    local after = redis.call('HGET', key_next_key, nxt)
    redis.call('HDEL', key_next_key, nxt)
    if not after then break end
    nxt = after
    if tonumber(nxt) > stop then
      local record = redis.call('HGET', records_key, nxt)
      local b = record and string.byte(record, 1)
      local due = not record
      if not record then
        redis.call('HSET', records_key, nxt, 'A|0||||')
        redis.call('ZADD', due_key, now_text, nxt)
      elseif b ~= 75 and b ~= 82 then
        local sc = redis.call('ZSCORE', due_key, nxt)
        if sc and tonumber(sc) >= PARKED_SCORE then
          redis.call('ZADD', due_key, now_text, nxt)
          due = true
        end
      end
      if not record or (b ~= 75 and b ~= 82) then
        redis.call('HSET', key_spans_key, k, nxt .. '|' .. tail)
        return due
      end
    end
  end
  redis.call('HDEL', key_spans_key, k)
  return false
end
-- The delivery sq (text) of key k is settled for good: it releases k if it is k's head.
-- Returns true when that made the next delivery of k due now.
local function release_key(key_spans_key, key_next_key, records_key, due_key, k, seq_text, now_text)
  if type(k) ~= 'string' then return false end
  local spec = redis.call('HGET', key_spans_key, k)
  if not spec then return false end
  local head, tail = parse_key_span(spec)
  return head == seq_text and pass_key(key_spans_key, key_next_key, records_key, due_key, k, head, tail, 0, now_text)
end
