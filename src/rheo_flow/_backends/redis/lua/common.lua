-- Helpers every script starts with (prepended by _scripts.py): named states, the keys of a
-- group partition, the server clock, number formats, chunked variadic commands, delivery
-- records, blocks and key spans (formats: _scripts.py; conventions: docs/architecture.md).

-- Delivery states: the first field of a delivery record.
local LEASED, AVAILABLE, ACKED, REJECTED = 'L', 'A', 'K', 'R'
-- Who settled a delivery (a record's fourth field): its lease's ack, nack or reject, or a
-- fetch that found its lease expired at max_attempts (dead-lettered).
local BY_ACK, BY_NACK, BY_REJECT, BY_EXPIRY = 'a', 'n', 'r', '-'
-- The record of a delivery due again that no lease took yet (redriven, or its key's next).
local WAITING_RECORD = 'A|0||||'
-- The first byte of an acked and of a rejected record: settled for good.
local ACKED_BYTE, REJECTED_BYTE = string.byte(ACKED), string.byte(REJECTED)
-- The score in the due set of a PARKED delivery: one with a record that waits behind its
-- key's head (only after a redrive), never due by time.
local PARKED = 4000000000000000
-- How many arguments one variadic command takes at most: Lua's unpack has a stack limit.
local CHUNK = 2000
-- What a large event's data field starts with (then its blob's token, append_many.lua):
-- NUL starts no JSON text.
local BLOB_MARK = '\0'
-- Where the values of a stream entry's fields are (as XADD wrote them: meta, data, time,
-- then 'at' and its deliver_at for a scheduled event).
local ENTRY_META, ENTRY_DATA, ENTRY_TIME, ENTRY_AT = 2, 4, 6, 8
-- When a stream entry's event is scheduled for, if that is after `now` (else nil).
local function scheduled_at(entry_fields, now)
  local at = entry_fields[ENTRY_AT]
  if at then
    at = tonumber(at)
    if at > now then return at end
  end
  return nil
end

-- The keys of a group partition, by name, in the order of KeyLayout.group: the
-- partition's stream and meta hash at `stream_at` and `stream_at + 1`, the group's own
-- keys at `group_at`, ... (trim passes several groups' keys after one partition's).
local function group_keys(stream_at, group_at)
  return {
    stream = KEYS[stream_at],           -- x: the events (entry id '<seq>-0')
    meta = KEYS[stream_at + 1],         -- m: hw, lw, ts, mk
    group = KEYS[group_at],             -- G: f (frontier), c (cursor), ma, o ('k': key-ordered)
    records = KEYS[group_at + 1],       -- :d: seq -> delivery record
    due = KEYS[group_at + 2],           -- :z: available and leased seqs by when due
    dead = KEYS[group_at + 3],          -- :r: dead-lettered seqs
    blocks = KEYS[group_at + 4],        -- :b: block token -> 'first|last|deadline'
    block_deadlines = KEYS[group_at + 5], -- :y: unexpired block tokens by deadline
    key_spans = KEYS[group_at + 6],     -- :k: held key -> 'head|tail'
    key_next = KEYS[group_at + 7],      -- :n: passed-over seq -> the next seq of its key
  }
end

local function now_ms()
  local seconds, microseconds = unpack(redis.call('TIME'))
  return tonumber(seconds) * 1000 + math.floor(tonumber(microseconds) / 1000)
end
-- An integer as text (no exponent, no '.0').
local function int_text(n) return string.format('%d', n) end
-- The stream entry id of a sequence.
local function entry_id(n) return string.format('%d-0', n) end
-- Variadic commands in chunks of CHUNK arguments after `head`.
local function bulk(head, list)
  local count = #list
  local i = 1
  while i <= count do
    local j = math.min(i + CHUNK - 1, count)
    local args = {}
    for k = 1, #head do args[k] = head[k] end
    for k = i, j do args[#args + 1] = list[k] end
    redis.call(unpack(args))
    i = j + 1
  end
end
-- Standalone Redis only (a Cluster passes none of these keys: they carry no hash tag):
-- the summaries of a group's partitions that let one fetch_many call visit only the
-- partitions with work. `due` (P:due:<s>:<g>) scores each partition no later than when it
-- may next have a due delivery (a nack's delay, a lease's or a block's deadline); `fresh`
-- (P:new:<s>:<g>) holds the partitions that may have events past the group's cursor. A
-- fetch that visits a partition writes its exact entries; an append adds its partition
-- to every group's `fresh`; every other script that makes work due earlier lowers `due`
-- (note_due) or moves a cursor back (note_fresh). Nil when KEYS has none at `at`.
local function summary_keys(at)
  if not KEYS[at] then return nil end
  return {due = KEYS[at], fresh = KEYS[at + 1]}
end
-- The partition of a partition key ('{P:s:p}:x'), as text.
local function partition_of(stream_key)
  return string.match(stream_key, ':(%d+)}:x$')
end
-- Work of the partition of `keys` may be due from `score_text` on: lower its summary.
local function note_due(keys, score_text)
  if keys.summary then
    redis.call('ZADD', keys.summary.due, 'LT', score_text, partition_of(keys.stream))
  end
end
-- The group's cursor in the partition of `keys` may have moved back before its events.
local function note_fresh(keys)
  if keys.summary then
    redis.call('SADD', keys.summary.fresh, partition_of(keys.stream))
  end
end
local function hmget(key, fields)
  local out = {}
  local count = #fields
  local i = 1
  while i <= count do
    local j = math.min(i + CHUNK - 1, count)
    local part = redis.call('HMGET', key, unpack(fields, i, j))
    for k = 1, #part do out[#out + 1] = part[k] end
    i = j + 1
  end
  return out
end
-- The hash fields of the sequences first..last.
local function seq_fields(first, last)
  local out = {}
  for seq = first, last do out[#out + 1] = int_text(seq) end
  return out
end
-- HDEL the fields of the sequences first..last, a chunk at a time (the range may be long).
local function hdel_range(key, first, last)
  local fields = {}
  for seq = first, last do
    fields[#fields + 1] = int_text(seq)
    if #fields >= CHUNK then
      redis.call('HDEL', key, unpack(fields))
      fields = {}
    end
  end
  if #fields > 0 then redis.call('HDEL', key, unpack(fields)) end
end
-- The sequences first..last (as fields) that have no delivery record of their own.
local function unrecorded(records_key, first, last)
  local fields = seq_fields(first, last)
  local stored = hmget(records_key, fields)
  local out = {}
  for i, seq_text in ipairs(fields) do
    if not stored[i] then out[#out + 1] = seq_text end
  end
  return out
end
-- The available and leased deliveries of the sequences first..last leave the due set
-- and the PEL.
local function drop_active(keys, group, first, last)
  local due_removes, pel_acks = {}, {}
  for _, seq_text in ipairs(redis.call('ZRANGE', keys.due, 0, -1)) do
    local seq = tonumber(seq_text)
    if seq >= first and seq <= last then
      due_removes[#due_removes + 1] = seq_text
      pel_acks[#pel_acks + 1] = seq_text .. '-0'
    end
  end
  if #due_removes > 0 then
    bulk({'ZREM', keys.due}, due_removes)
    bulk({'XACK', keys.stream, group}, pel_acks)
  end
end

-- A delivery record: state|attempt|lease_id|settled_by|rejected_at|reason, then NUL and
-- the last error when one was recorded.
local function parse_record(record)
  local state, attempt, lease_id, settled_by, rejected_at, reason =
    string.match(record, '^(%a)|(%d+)|([^|]*)|([^|]*)|([^|]*)|(.*)$')
  local last_error = nil
  local cut = reason and string.find(reason, '\0', 1, true)
  if cut then
    last_error = string.sub(reason, cut + 1)
    reason = string.sub(reason, 1, cut - 1)
  end
  return state, tonumber(attempt), lease_id, settled_by, rejected_at, reason, last_error
end
local function record_text(state, attempt, lease_id, settled_by, rejected_at, reason,
                           last_error)
  local record = state .. '|' .. int_text(attempt) .. '|' .. lease_id .. '|' .. settled_by
    .. '|' .. rejected_at .. '|' .. reason
  if last_error then record = record .. '\0' .. last_error end
  return record
end
-- The record of a current lease (attempt as text); a current lease of a block has none.
local function lease_record(attempt_text, lease_id)
  return LEASED .. '|' .. attempt_text .. '|' .. lease_id .. '|||'
end
-- The record of a delivery its lease acked.
local function ack_record(attempt_text, lease_id)
  return ACKED .. '|' .. attempt_text .. '|' .. lease_id .. '|' .. BY_ACK .. '||'
end
-- Whether a record is settled for good (acked or rejected): its first byte tells.
local function is_settled(record)
  local first_byte = string.byte(record, 1)
  return first_byte == ACKED_BYTE or first_byte == REJECTED_BYTE
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
      if not record or not is_settled(record) then break end
      moved = k
    end
    frontier = frontier + moved
    if moved < step then return frontier end
    if step < 1024 then step = step * 2 end
  end
end

-- Blocks. The lease id of a block's delivery without a record of its own: the block's
-- token, ':', the sequence.
local function block_lease_id(token, seq_text) return token .. ':' .. seq_text end
-- A block spec 'first|last|deadline': first and last sequence, deadline (as text).
local function block_spec(first, last, deadline_text)
  return int_text(first) .. '|' .. int_text(last) .. '|' .. deadline_text
end
local function parse_block(spec)
  local first, last, deadline_text = string.match(spec, '^(%d+)|(%d+)|(%d+)$')
  return tonumber(first), tonumber(last), deadline_text
end

-- Key-ordered groups (field 'o' = 'k' of the group hash). A key is HELD while it has an
-- unsettled delivery: key_spans maps it to 'head|tail', the unsettled (leased, waiting or
-- parked) one and the last delivery of the key the cursor passed. key_next maps each
-- delivery of a held key the cursor passed over (no record, neither due nor in the PEL,
-- not leased by a block whose range it is in) to the next one of its key, so a key's
-- deferred deliveries are a linked list from its head to its tail. A delivery with a
-- record that is not its key's head (only after a redrive) is PARKED.
local function key_span(head, tail) return head .. '|' .. tail end
-- The head and tail (as text) of a key span.
local function parse_key_span(spec)
  return string.match(spec, '^(%d+)|(%d+)$')
end
-- The key of a stream entry's fields (nil when it has none). Meta is JSON [id, type, key,
-- headers]: when neither of the three strings holds an escape, one match finds the key.
local function entry_key(entry_fields)
  local meta_text = entry_fields[ENTRY_META]
  local plain = string.match(meta_text, '^%["[^"\\]*","[^"\\]*","([^"\\]*)",')
  if plain then return plain end
  local ok, meta = pcall(cjson.decode, meta_text)
  if ok and type(meta) == 'table' and type(meta[3]) == 'string' then return meta[3] end
  return nil
end
-- The key of the event of a sequence (text), read from the stream (nil: none or gone).
local function key_of_seq(stream_key, seq_text)
  local entry = redis.call('XRANGE', stream_key, seq_text .. '-0', seq_text .. '-0')
  if entry[1] then return entry_key(entry[1][2]) end
  return nil
end
-- Of the sequences (text, ascending) of a key-ordered group's block without a record of
-- their own, those the block leased: the keyless ones and their key's heads (an entry
-- gone from the stream stays in, as in any group).
local function block_leased(keys, seq_texts)
  -- Sequence -> its event's key, or NO_KEY for a keyless event.
  local NO_KEY = false
  local key_of = {}
  for _, entry in ipairs(redis.call('XRANGE', keys.stream, seq_texts[1] .. '-0',
                                    seq_texts[#seq_texts] .. '-0')) do
    key_of[string.sub(entry[1], 1, -3)] = entry_key(entry[2]) or NO_KEY
  end
  local out = {}
  for _, seq_text in ipairs(seq_texts) do
    local event_key = key_of[seq_text]
    local span = event_key and redis.call('HGET', keys.key_spans, event_key)
    if not span or parse_key_span(span) == seq_text then out[#out + 1] = seq_text end
  end
  return out
end
-- Expired blocks (their tokens): their entries past the frontier without a record of
-- their own get one (LEASED, due at the block's deadline); the part at or behind the
-- frontier stays. In a key-ordered group (`keyed`) such an entry that is not keyless nor
-- its key's head was passed over, not leased (see fetch.lua): it stays as it is.
local function expire_blocks(keys, tokens, frontier, keyed)
  if #tokens == 0 then return end
  local specs = hmget(keys.blocks, tokens)
  local gone = {}
  for k, token in ipairs(tokens) do
    local spec = specs[k]
    if spec then
      local first, last, deadline_text = parse_block(spec)
      if last > frontier then
        local record_writes, due_adds = {}, {}
        local seq_texts = unrecorded(keys.records, math.max(first, frontier + 1), last)
        if keyed and #seq_texts > 0 then seq_texts = block_leased(keys, seq_texts) end
        for _, seq_text in ipairs(seq_texts) do
          record_writes[#record_writes + 1] = seq_text
          record_writes[#record_writes + 1] = lease_record('1', block_lease_id(token, seq_text))
          due_adds[#due_adds + 1] = deadline_text
          due_adds[#due_adds + 1] = seq_text
        end
        if #record_writes > 0 then
          bulk({'HSET', keys.records}, record_writes)
          bulk({'ZADD', keys.due}, due_adds)
        end
        if first <= frontier then
          redis.call('HSET', keys.blocks, token, block_spec(first, frontier, deadline_text))
        else
          gone[#gone + 1] = token
        end
      end
    end
  end
  if #gone > 0 then bulk({'HDEL', keys.blocks}, gone) end
  bulk({'ZREM', keys.block_deadlines}, tokens)
end
-- Every block keeps only its part inside [low, high].
local function clip_blocks(keys, low, high)
  local all = redis.call('HGETALL', keys.blocks)
  local gone, keep = {}, {}
  for k = 1, #all, 2 do
    local first, last, deadline_text = parse_block(all[k + 1])
    local from, to = math.max(first, low), math.min(last, high)
    if from > to then
      gone[#gone + 1] = all[k]
    elseif from ~= first or to ~= last then
      keep[#keep + 1] = all[k]
      keep[#keep + 1] = block_spec(from, to, deadline_text)
    end
  end
  if #gone > 0 then
    bulk({'HDEL', keys.blocks}, gone)
    bulk({'ZREM', keys.block_deadlines}, gone)
  end
  if #keep > 0 then bulk({'HSET', keys.blocks}, keep) end
end
-- Before the frontier moves back to low - 1: the block entries in [low, high] (all behind
-- it, so acked by their block lease) get an ack record of their own.
local function own_acks(keys, low, high)
  local all = redis.call('HGETALL', keys.blocks)
  for k = 1, #all, 2 do
    local token = all[k]
    local first, last = parse_block(all[k + 1])
    local from, to = math.max(first, low), math.min(last, high)
    if from <= to then
      local record_writes = {}
      for _, seq_text in ipairs(unrecorded(keys.records, from, to)) do
        record_writes[#record_writes + 1] = seq_text
        record_writes[#record_writes + 1] = ack_record('1', block_lease_id(token, seq_text))
      end
      if #record_writes > 0 then bulk({'HSET', keys.records}, record_writes) end
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
-- The head of a held key is settled or gone: the next delivery of the key neither settled
-- nor at or below `stop` becomes its head (due now if it was passed over or PARKED);
-- none: the key is no longer held. Returns true when it made a delivery due now.
local function pass_key(keys, event_key, head, tail, stop, now_text)
  local nxt = head
  while nxt ~= tail do
    local after = redis.call('HGET', keys.key_next, nxt)
    redis.call('HDEL', keys.key_next, nxt)
    if not after then break end
    nxt = after
    if tonumber(nxt) > stop then
      local record = redis.call('HGET', keys.records, nxt)
      local unsettled = record and not is_settled(record)
      local due = not record
      if not record then
        redis.call('HSET', keys.records, nxt, WAITING_RECORD)
        redis.call('ZADD', keys.due, now_text, nxt)
      elseif unsettled then
        local score = redis.call('ZSCORE', keys.due, nxt)
        if score and tonumber(score) >= PARKED then
          redis.call('ZADD', keys.due, now_text, nxt)
          due = true
        end
      end
      if not record or unsettled then
        redis.call('HSET', keys.key_spans, event_key, key_span(nxt, tail))
        return due
      end
    end
  end
  redis.call('HDEL', keys.key_spans, event_key)
  return false
end
-- The delivery of a sequence (text) and key is settled for good: it releases the key if
-- it is the key's head. Returns true when that made the key's next delivery due now.
local function release_key(keys, event_key, seq_text, now_text)
  if type(event_key) ~= 'string' then return false end
  local span = redis.call('HGET', keys.key_spans, event_key)
  if not span then return false end
  local head, tail = parse_key_span(span)
  return head == seq_text and pass_key(keys, event_key, head, tail, 0, now_text)
end
