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
local stream_key, meta_key, group_key, records_key, due_key, dead_key, blocks_key, block_deadlines_key, key_spans_key, key_next_key = unpack(KEYS, 1, 10)
local group, consumer, lease_prefix, block_token = ARGV[1], ARGV[2], ARGV[5], ARGV[6]
local quota, lease_ms = tonumber(ARGV[3]), tonumber(ARGV[4])
local meta = redis.call('HMGET', meta_key, 'hw', 'mk')
if not meta[2] then return 'LOST' end
local group_fields = redis.call('HMGET', group_key, 'f', 'c', 'ma', 'o')
if not group_fields[1] then return 'NOGROUP' end
-- The same call run again (the client resent it after its answer was lost): the
-- first run's block keeps its leases until they expire; granting more under the
-- same token would overwrite that block and strand its deliveries for ever.
if redis.call('HEXISTS', blocks_key, block_token) == 1 then return 'AGAIN' end
local frontier, cursor, max_attempts = tonumber(group_fields[1]), tonumber(group_fields[2]), tonumber(group_fields[3])
-- A key-ordered group: the events of blocked keys are passed over (see keyed_new).
local keyed = group_fields[4] == 'k'
local high_water = tonumber(meta[1] or '0')
local now = now_ms()
local now_text = int_text(now)
local deadline_text = int_text(now + lease_ms)
local items = {}
-- The reply: the JSON head, then the data of each item as stored (no re-encoding).
local datas = {''}
local redelivered = 0
local more = 0
-- The range of an unordered group's new deliveries (see plain_new).
local range = '0,0'
-- Blocks past their deadline become per-delivery records, found below like any other.
expire_blocks(records_key, due_key, blocks_key, block_deadlines_key, redis.call('ZRANGEBYSCORE', block_deadlines_key, '-inf', now_text), frontier, keyed and stream_key, key_spans_key)
-- A new delivery (sequence sq, as text, and the entry's fields) goes into the reply.
local function new_item(seq_text, entry_fields)
  items[#items + 1] = '[' .. seq_text .. ',1,' .. entry_fields[6] .. ',' .. entry_fields[2] .. ']'
  datas[#datas + 1] = entry_fields[4]
end
-- New deliveries of an unordered group: the next `want` entries past the cursor, leased
-- as one range and not read (every entry c + 1..hw is there: trim raises c to its bound).
-- They do not enter the consumer group's PEL; its last id follows the cursor all the
-- same (XREADGROUP '>' of a key-ordered group, or of an older release, starts there).
-- Returns the first and last sequence and the new cursor.
local function plain_new(want)
  local last = math.min(cursor + want, high_water)
  redis.call('XGROUP', 'SETID', stream_key, group, entry_id(last))
  return int_text(cursor + 1), int_text(last), last
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
  local known, span_writes, link_writes, passed_acks, claimed_ids = {}, {}, {}, {}, {}
  local first, last = nil, nil
  local scanned_to = cursor
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
      local specs = hmget(key_spans_key, ask)
      for i, k in ipairs(ask) do known[k] = specs[i] end
    end
    local done, seq_text = 0, nil
    for i, e in ipairs(entries) do
      if want == 0 then break end
      seq_text = string.sub(e[1], 1, -3)
      done = i
      local k = keys[i]
      local spec = k and known[k]
      if spec then
        local head, tail = parse_key_span(spec)
        link_writes[#link_writes + 1] = tail
        link_writes[#link_writes + 1] = seq_text
        spec = head .. '|' .. seq_text
        if pel then passed_acks[#passed_acks + 1] = e[1] end
      else
        spec = seq_text .. '|' .. seq_text
        want = want - 1
        new_item(seq_text, e[2])
        if not first then first = seq_text end
        last = seq_text
        if not pel then claimed_ids[#claimed_ids + 1] = e[1] end
      end
      if k then
        -- HSET K below: a key set twice keeps its last spec.
        known[k] = spec
        span_writes[#span_writes + 1] = k
        span_writes[#span_writes + 1] = spec
      end
    end
    if seq_text then scanned_to = tonumber(seq_text) end
    budget = budget - done
  end
  local res = redis.call('XREADGROUP', 'GROUP', group, consumer, 'COUNT', want,
    'STREAMS', stream_key, '>')
  if res then take(res[1][2], true) end
  local read = scanned_to
  while want > 0 and scanned_to < high_water and budget > 0 do
    local entries = redis.call('XRANGE', stream_key, '(' .. entry_id(scanned_to), '+', 'COUNT',
      math.min(math.max(want, 64), budget))
    if #entries == 0 then break end
    take(entries, false)
  end
  if #link_writes > 0 then bulk({'HSET', key_next_key}, link_writes) end
  if #span_writes > 0 then bulk({'HSET', key_spans_key}, span_writes) end
  if #passed_acks > 0 then bulk({'XACK', stream_key, group}, passed_acks) end
  if scanned_to > read then redis.call('XGROUP', 'SETID', stream_key, group, entry_id(scanned_to)) end
  local i = 1
  while i <= #claimed_ids do
    local j = math.min(i + CHUNK - 1, #claimed_ids)
    local args = {'XCLAIM', stream_key, group, consumer, '0'}
    for k = i, j do args[#args + 1] = claimed_ids[k] end
    args[#args + 1] = 'FORCE'
    args[#args + 1] = 'JUSTID'
    redis.call(unpack(args))
    i = j + 1
  end
  if want > 0 and scanned_to < high_water and budget <= 0 then more = 1 end
  return first, last, scanned_to
end
if quota > 0 then
  local record_writes, dead_acks, dead_adds, due, next_attempt, last_errors = {}, {}, {}, {}, {}, {}
  local freed_seqs, parked = {}, {}
  local frontier_moves = false
  -- Due deliveries: available (nack delay over) or leased past their deadline.
  while #due < quota do
    local ids = redis.call('ZRANGEBYSCORE', due_key, '-inf', now_text, 'LIMIT', 0, quota - #due)
    if #ids == 0 then break end
    local records = hmget(records_key, ids)
    local due_removes, due_adds = {}, {}
    for k, seq_text in ipairs(ids) do
      local record = records[k]
      if not record then
        due_removes[#due_removes + 1] = seq_text
      else
        local state, attempt, lease_id, _, _, _, last_error = parse_record(record)
        if attempt >= max_attempts then
          record_writes[#record_writes + 1] = seq_text
          record_writes[#record_writes + 1] = record_text('R', attempt, lease_id, '-', now_text, 'max_attempts', last_error)
          due_removes[#due_removes + 1] = seq_text
          dead_adds[#dead_adds + 1] = seq_text
          dead_adds[#dead_adds + 1] = seq_text
          dead_acks[#dead_acks + 1] = seq_text .. '-0'
          if keyed then freed_seqs[#freed_seqs + 1] = seq_text end
          if tonumber(seq_text) == frontier + 1 then frontier_moves = true end
        else
          local n = tonumber(seq_text)
          due[#due + 1] = n
          next_attempt[n] = attempt + 1
          last_errors[n] = last_error
          due_adds[#due_adds + 1] = deadline_text
          due_adds[#due_adds + 1] = seq_text
        end
      end
    end
    if #due_removes > 0 then bulk({'ZREM', due_key}, due_removes) end
    if #due_adds > 0 then bulk({'ZADD', due_key}, due_adds) end
  end
  local n = 0
  if #due > 0 then
    table.sort(due)
    local bodies = {}
    local i = 1
    while i <= #due do
      local j = math.min(i + CHUNK - 1, #due)
      local args = {'XCLAIM', stream_key, group, consumer, '0'}
      for k = i, j do args[#args + 1] = entry_id(due[k]) end
      args[#args + 1] = 'FORCE'
      local claimed = redis.call(unpack(args))
      for _, e in ipairs(claimed) do
        if e then bodies[e[1]] = e[2] end
      end
      i = j + 1
    end
    local gone = {}
    for _, seq in ipairs(due) do
      local entry_fields = bodies[entry_id(seq)]
      local seq_text = int_text(seq)
      local head = nil
      if entry_fields and keyed then
        -- Only the head of its key may be leased (another one waits parked).
        local k = entry_key(entry_fields)
        local spec = k and redis.call('HGET', key_spans_key, k)
        if spec then head = parse_key_span(spec) end
      end
      if head and head ~= seq_text then
        parked[#parked + 1] = int_text(PARKED_SCORE)
        parked[#parked + 1] = seq_text
      elseif entry_fields then
        n = n + 1
        local attempt = next_attempt[seq]
        items[#items + 1] = '[' .. seq_text .. ',' .. int_text(attempt) .. ',' .. entry_fields[6] .. ',' .. entry_fields[2] .. ']'
        datas[#datas + 1] = entry_fields[4]
        record_writes[#record_writes + 1] = seq_text
        record_writes[#record_writes + 1] = record_text('L', attempt, lease_prefix .. n, '', '', '', last_errors[seq])
      else
        gone[#gone + 1] = seq_text
      end
    end
    if #gone > 0 then
      bulk({'ZREM', due_key}, gone)
      bulk({'HDEL', records_key}, gone)
    end
  end
  if #parked > 0 then bulk({'ZADD', due_key}, parked) end
  redelivered = n
  -- New deliveries past the group's cursor are one block: a single record stands for
  -- all their leases (attempt 1, lease id '<block token>:<seq>', one deadline) until
  -- each one gets its own record (settle, renew) or the block expires.
  local want = quota - n
  if want > 0 and cursor < high_water then
    local first, last, new_cursor
    if keyed then
      first, last, new_cursor = keyed_new(want)
    else
      first, last, new_cursor = plain_new(want)
      range = first .. ',' .. last
    end
    if first then
      redis.call('HSET', blocks_key, block_token, first .. '|' .. last .. '|' .. deadline_text)
      redis.call('ZADD', block_deadlines_key, deadline_text, block_token)
    end
    if new_cursor > cursor then
      cursor = new_cursor
      redis.call('HSET', group_key, 'c', int_text(cursor))
    end
  end
  if #record_writes > 0 then bulk({'HSET', records_key}, record_writes) end
  if #dead_acks > 0 then
    bulk({'ZADD', dead_key}, dead_adds)
    bulk({'XACK', stream_key, group}, dead_acks)
  end
  if frontier_moves then redis.call('HSET', group_key, 'f', int_text(advance(records_key, frontier))) end
  -- Dead-lettered heads release their keys (the next delivery is due from now on).
  for _, seq_text in ipairs(freed_seqs) do release_key(key_spans_key, key_next_key, records_key, due_key, key_of_seq(stream_key, seq_text), seq_text, now_text) end
end
local still_due = redis.call('ZCOUNT', due_key, '-inf', now_text)
if high_water > cursor then still_due = still_due + high_water - cursor end
datas[1] = '[' .. int_text(high_water) .. ',' .. int_text(still_due) .. ',' .. deadline_text .. ',' .. int_text(redelivered) .. ',['
  .. table.concat(items, ',') .. '],' .. int_text(more) .. ',' .. range .. ',' .. int_text(keyed and -1 or cursor)
  .. ']'
return datas
