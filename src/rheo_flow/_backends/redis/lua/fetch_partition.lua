-- Prepended to fetch and fetch_many, after common.lua: fetch_partition, the fetch of one
-- group partition (fetch.lua's header tells its reply), and the summaries it keeps.
-- The earliest due delivery or block deadline of the group partition of `keys` (its
-- score as text; nil: none).
local function earliest_due(keys)
  local earliest = redis.call('ZRANGE', keys.due, 0, 0, 'WITHSCORES')[2]
  local block_due = redis.call('ZRANGE', keys.block_deadlines, 0, 0, 'WITHSCORES')[2]
  if block_due and (not earliest or tonumber(block_due) < tonumber(earliest)) then
    earliest = block_due
  end
  return earliest
end
-- Write the exact summary of the partition of `keys` (standalone Redis: keys.summary):
-- its earliest due delivery or block deadline, and whether events are past the cursor.
-- fresh: whether `fresh` holds the partition, when the caller knows (nil: it does not).
local function summarize(keys, high_water, cursor, fresh)
  local summary = keys.summary
  if not summary then return end
  local partition = partition_of(keys.stream)
  local earliest = earliest_due(keys)
  if earliest then
    redis.call('ZADD', summary.due, earliest, partition)
  else
    redis.call('ZREM', summary.due, partition)
  end
  if high_water > cursor then
    if not fresh then redis.call('SADD', summary.fresh, partition) end
  elseif fresh ~= false then
    redis.call('SREM', summary.fresh, partition)
  end
end
-- keys: the group partition's keys (group_keys), with `summary` (summary_keys) on
--   standalone Redis; quota, lease_ms: numbers; lease_prefix, block_token: see fetch.lua;
--   read_new: true to read an unordered group's new deliveries here (they come back as
--   items, not as a range); fresh: whether the group's `fresh` summary holds the
--   partition, when the caller knows (nil: it does not).
local function fetch_partition(keys, group, consumer, quota, lease_ms, lease_prefix,
                               block_token, read_new, fresh)
  -- What `known` holds for a key looked up and not held (a held key: its span).
  local NOT_HELD = false
  -- How many events past its quota a key-ordered group's scan reads at most per call.
  local SCAN_BUDGET = 1000
  local high_water_text, marker, scheduled_last_text =
    unpack(redis.call('HMGET', keys.meta, 'hw', 'mk', 'sl'))
  if not marker then return 'LOST' end
  -- The highest sequence of a scheduled event (0: none): past it, nothing waits.
  local scheduled_last = tonumber(scheduled_last_text or '0')
  local frontier_text, cursor_text, max_attempts_text, ordering, paused_until =
    unpack(redis.call('HMGET', keys.group, 'f', 'c', 'ma', 'o', 'pz'))
  if not frontier_text then return 'NOGROUP' end
  -- The same call run again (the client resent it after its answer was lost): the
  -- first run's block keeps its leases until they expire; granting more under the
  -- same token would overwrite that block and strand its deliveries for ever.
  if redis.call('HEXISTS', keys.blocks, block_token) == 1 then return 'AGAIN' end
  local frontier, cursor = tonumber(frontier_text), tonumber(cursor_text)
  local max_attempts = tonumber(max_attempts_text)
  -- A key-ordered group: the events of held keys are passed over (see keyed_new).
  local keyed = ordering == 'k'
  local high_water = tonumber(high_water_text or '0')
  local now = now_ms()
  local now_text = int_text(now)
  -- A paused group (pause.lua) leases nothing, and reports nothing due (no top-up rounds).
  local paused = paused_until and tonumber(paused_until) > now
  if paused then quota = 0 end
  local deadline_text = int_text(now + lease_ms)
  local items = {}
  -- The reply: the head, then the data of each item as stored (no re-encoding).
  local datas = {''}
  local redelivered = 0
  local more = 0
  -- The range of an unordered group's new deliveries (see plain_new).
  local range = '0,0'
  local range_count = 0
  -- Blocks past their deadline become per-delivery records, found below like any other.
  expire_blocks(keys, redis.call('ZRANGEBYSCORE', keys.block_deadlines, '-inf', now_text),
                frontier, keyed)
  -- A delivery (sequence as text, attempt as text, the entry's fields) goes into the reply.
  local function add_item(seq_text, attempt_text, entry_fields)
    items[#items + 1] = '[' .. seq_text .. ',' .. attempt_text .. ',' .. entry_fields[ENTRY_TIME]
      .. ',' .. entry_fields[ENTRY_META] .. ']'
    datas[#datas + 1] = entry_fields[ENTRY_DATA]
  end
  -- New deliveries of an unordered group: the next `want` entries past the cursor, leased
  -- as one range and not read (every entry cursor + 1..high_water is there: trim raises
  -- the cursor to its bound). They do not enter the consumer group's PEL; its last id
  -- follows the cursor all the same (XREADGROUP '>' of a key-ordered group, or of an older
  -- release, starts there). Returns the first and last sequence and the new cursor.
  local function plain_new(want)
    local last = math.min(cursor + want, high_water)
    redis.call('XGROUP', 'SETID', keys.stream, group, entry_id(last))
    return int_text(cursor + 1), int_text(last), last
  end
  -- A scheduled event not due cannot be in a block (which leases every event from its
  -- first to its last), so in an unordered group whose next events hold one, the window
  -- the fetch could lease becomes records: up to `quota` events due, past the scheduled
  -- ones among them (at most quota + 4096 entries read), each WAITING_RECORD (attempt 0)
  -- and due now, or at its deliver_at; the cursor moves to the window's end. The loop
  -- over due deliveries below then leases those due now, as it leases nacked ones.
  local function split_scheduled(quota)
    local entries = redis.call('XRANGE', keys.stream, '(' .. entry_id(cursor),
                               entry_id(high_water), 'COUNT', quota + 4096)
    local record_writes, due_adds = {}, {}
    local taken, last, found = 0, cursor, false
    for _, entry in ipairs(entries) do
      local seq_text = string.sub(entry[1], 1, -3)
      local at = scheduled_at(entry[2], now)
      if not at then
        if taken == quota then break end
        taken = taken + 1
      end
      found = found or at ~= nil
      last = tonumber(seq_text)
      record_writes[#record_writes + 1] = seq_text
      record_writes[#record_writes + 1] = WAITING_RECORD
      due_adds[#due_adds + 1] = at and int_text(at) or now_text
      due_adds[#due_adds + 1] = seq_text
    end
    if not found then return end
    bulk({'HSET', keys.records}, record_writes)
    bulk({'ZADD', keys.due}, due_adds)
    cursor = last
    redis.call('HSET', keys.group, 'c', int_text(cursor))
    redis.call('XGROUP', 'SETID', keys.stream, group, entry_id(cursor))
  end
  -- New deliveries of a key-ordered group: the events of keyless and free keys are leased
  -- as in any group; those of held keys are passed over: linked behind their key's tail in
  -- key_next, with no record, neither due nor in the PEL. The first read is XREADGROUP of
  -- `want` entries, which is all it takes unless some were passed over; then XRANGE reads
  -- on (the leased ones XCLAIMed into the PEL, the group's cursor set after), at most
  -- want + SCAN_BUDGET events in all (`more` set when that stopped it). Returns the first
  -- and last sequence leased (nil: none) and the new cursor.
  local function keyed_new(want)
    local budget = want + SCAN_BUDGET
    -- Event key -> its span, or NOT_HELD; span_writes and link_writes: HSET arguments.
    local known, span_writes, link_writes, passed_acks, claimed_ids = {}, {}, {}, {}, {}
    -- Scheduled events not due: their records (WAITING_RECORD) and due entries (at their
    -- time). Each holds its key meanwhile: its key's head when the key was free, else
    -- linked behind the key's tail (with a record, so a release never makes it due early).
    local scheduled_writes, scheduled_dues = {}, {}
    local first, last = nil, nil
    local scanned_to = cursor
    -- The entries in order, until `want` are leased; in_pel: they are in the PEL already.
    local function take(entries, in_pel)
      local event_keys, ask = {}, {}
      for i, entry in ipairs(entries) do
        local event_key = entry_key(entry[2])
        event_keys[i] = event_key
        if event_key and known[event_key] == nil then
          known[event_key] = NOT_HELD
          ask[#ask + 1] = event_key
        end
      end
      if #ask > 0 then
        local spans = hmget(keys.key_spans, ask)
        for i, event_key in ipairs(ask) do known[event_key] = spans[i] end
      end
      local done, seq_text = 0, nil
      for i, entry in ipairs(entries) do
        if want == 0 then break end
        seq_text = string.sub(entry[1], 1, -3)
        done = i
        local event_key = event_keys[i]
        local span = event_key and known[event_key]
        local at = scheduled_last >= tonumber(seq_text) and scheduled_at(entry[2], now)
        if at then
          scheduled_writes[#scheduled_writes + 1] = seq_text
          scheduled_writes[#scheduled_writes + 1] = WAITING_RECORD
          scheduled_dues[#scheduled_dues + 1] = int_text(at)
          scheduled_dues[#scheduled_dues + 1] = seq_text
          if span then
            local head, tail = parse_key_span(span)
            link_writes[#link_writes + 1] = tail
            link_writes[#link_writes + 1] = seq_text
            span = key_span(head, seq_text)
          else
            span = key_span(seq_text, seq_text)
          end
          if in_pel then passed_acks[#passed_acks + 1] = entry[1] end
        elseif span then
          local head, tail = parse_key_span(span)
          link_writes[#link_writes + 1] = tail
          link_writes[#link_writes + 1] = seq_text
          span = key_span(head, seq_text)
          if in_pel then passed_acks[#passed_acks + 1] = entry[1] end
        else
          span = key_span(seq_text, seq_text)
          want = want - 1
          add_item(seq_text, '1', entry[2])
          if not first then first = seq_text end
          last = seq_text
          if not in_pel then claimed_ids[#claimed_ids + 1] = entry[1] end
        end
        if event_key then
          -- HSET below: a key set twice keeps its last span.
          known[event_key] = span
          span_writes[#span_writes + 1] = event_key
          span_writes[#span_writes + 1] = span
        end
      end
      if seq_text then scanned_to = tonumber(seq_text) end
      budget = budget - done
    end
    local res = redis.call('XREADGROUP', 'GROUP', group, consumer, 'COUNT', want,
      'STREAMS', keys.stream, '>')
    if res then take(res[1][2], true) end
    local read = scanned_to
    while want > 0 and scanned_to < high_water and budget > 0 do
      local entries = redis.call('XRANGE', keys.stream, '(' .. entry_id(scanned_to), '+', 'COUNT',
        math.min(math.max(want, 64), budget))
      if #entries == 0 then break end
      take(entries, false)
    end
    if #scheduled_writes > 0 then
      bulk({'HSET', keys.records}, scheduled_writes)
      bulk({'ZADD', keys.due}, scheduled_dues)
    end
    if #link_writes > 0 then bulk({'HSET', keys.key_next}, link_writes) end
    if #span_writes > 0 then bulk({'HSET', keys.key_spans}, span_writes) end
    if #passed_acks > 0 then bulk({'XACK', keys.stream, group}, passed_acks) end
    if scanned_to > read then
      redis.call('XGROUP', 'SETID', keys.stream, group, entry_id(scanned_to))
    end
    local i = 1
    while i <= #claimed_ids do
      local j = math.min(i + CHUNK - 1, #claimed_ids)
      local args = {'XCLAIM', keys.stream, group, consumer, '0'}
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
    -- due: the sequences to lease again (with next_attempt and last_errors by sequence);
    -- dead_acks, dead_adds: those dead-lettered now (freed_seqs: of a key-ordered group).
    local record_writes, dead_acks, dead_adds, due, next_attempt, last_errors =
      {}, {}, {}, {}, {}, {}
    local freed_seqs, parked = {}, {}
    local frontier_moves = false
    if not keyed and scheduled_last > cursor and cursor < high_water then
      split_scheduled(quota)
    end
    -- Due deliveries: available (nack delay over) or leased past their deadline.
    while #due < quota do
      local ids = redis.call('ZRANGEBYSCORE', keys.due, '-inf', now_text, 'LIMIT', 0, quota - #due)
      if #ids == 0 then break end
      local records = hmget(keys.records, ids)
      local due_removes, due_adds = {}, {}
      for k, seq_text in ipairs(ids) do
        local record = records[k]
        if not record then
          due_removes[#due_removes + 1] = seq_text
        else
          local _, attempt, lease_id, _, _, _, last_error = parse_record(record)
          if attempt >= max_attempts then
            record_writes[#record_writes + 1] = seq_text
            record_writes[#record_writes + 1] = record_text(REJECTED, attempt, lease_id,
              BY_EXPIRY, now_text, 'max_attempts', last_error)
            due_removes[#due_removes + 1] = seq_text
            dead_adds[#dead_adds + 1] = seq_text
            dead_adds[#dead_adds + 1] = seq_text
            dead_acks[#dead_acks + 1] = seq_text .. '-0'
            if keyed then freed_seqs[#freed_seqs + 1] = seq_text end
            if tonumber(seq_text) == frontier + 1 then frontier_moves = true end
          else
            local seq = tonumber(seq_text)
            due[#due + 1] = seq
            next_attempt[seq] = attempt + 1
            last_errors[seq] = last_error
            due_adds[#due_adds + 1] = deadline_text
            due_adds[#due_adds + 1] = seq_text
          end
        end
      end
      if #due_removes > 0 then bulk({'ZREM', keys.due}, due_removes) end
      if #due_adds > 0 then bulk({'ZADD', keys.due}, due_adds) end
    end
    if #due > 0 then
      table.sort(due)
      -- Entry id -> the entry's fields, for the due ones still in the stream.
      local fields_of = {}
      local i = 1
      while i <= #due do
        local j = math.min(i + CHUNK - 1, #due)
        local args = {'XCLAIM', keys.stream, group, consumer, '0'}
        for k = i, j do args[#args + 1] = entry_id(due[k]) end
        args[#args + 1] = 'FORCE'
        local claimed = redis.call(unpack(args))
        for _, entry in ipairs(claimed) do
          if entry then fields_of[entry[1]] = entry[2] end
        end
        i = j + 1
      end
      local gone = {}
      for _, seq in ipairs(due) do
        local entry_fields = fields_of[entry_id(seq)]
        local seq_text = int_text(seq)
        local head = nil
        if entry_fields and keyed then
          -- Only the head of its key may be leased (another one waits PARKED).
          local event_key = entry_key(entry_fields)
          local span = event_key and redis.call('HGET', keys.key_spans, event_key)
          if span then head = parse_key_span(span) end
        end
        if head and head ~= seq_text then
          parked[#parked + 1] = int_text(PARKED)
          parked[#parked + 1] = seq_text
        elseif entry_fields then
          redelivered = redelivered + 1
          local attempt = next_attempt[seq]
          add_item(seq_text, int_text(attempt), entry_fields)
          record_writes[#record_writes + 1] = seq_text
          record_writes[#record_writes + 1] = record_text(LEASED, attempt,
            lease_prefix .. redelivered, '', '', '', last_errors[seq])
        else
          gone[#gone + 1] = seq_text
        end
      end
      if #gone > 0 then
        bulk({'ZREM', keys.due}, gone)
        bulk({'HDEL', keys.records}, gone)
      end
    end
    if #parked > 0 then bulk({'ZADD', keys.due}, parked) end
    -- New deliveries past the group's cursor are one block: a single record stands for
    -- all their leases (attempt 1, block_lease_id(block token, seq), one deadline) until
    -- each one gets its own record (settle, renew) or the block expires.
    local want = quota - redelivered
    if want > 0 and cursor < high_water then
      local first, last, new_cursor
      if keyed then
        first, last, new_cursor = keyed_new(want)
      else
        first, last, new_cursor = plain_new(want)
        if read_new then
          for _, entry in ipairs(redis.call('XRANGE', keys.stream, first .. '-0', last .. '-0')) do
            add_item(string.sub(entry[1], 1, -3), '1', entry[2])
          end
        else
          range = first .. ',' .. last
          range_count = tonumber(last) - tonumber(first) + 1
        end
      end
      if first then
        redis.call('HSET', keys.blocks, block_token, block_spec(first, last, deadline_text))
        redis.call('ZADD', keys.block_deadlines, deadline_text, block_token)
      end
      if new_cursor > cursor then
        cursor = new_cursor
        redis.call('HSET', keys.group, 'c', int_text(cursor))
      end
    end
    if #record_writes > 0 then bulk({'HSET', keys.records}, record_writes) end
    if #dead_acks > 0 then
      bulk({'ZADD', keys.dead}, dead_adds)
      bulk({'XACK', keys.stream, group}, dead_acks)
    end
    if frontier_moves then
      redis.call('HSET', keys.group, 'f', int_text(advance(keys.records, frontier)))
    end
    -- Dead-lettered heads release their keys (the next delivery is due from now on).
    for _, seq_text in ipairs(freed_seqs) do
      release_key(keys, key_of_seq(keys.stream, seq_text), seq_text, now_text)
    end
  end
  local still_due = redis.call('ZCOUNT', keys.due, '-inf', now_text)
  if high_water > cursor then still_due = still_due + high_water - cursor end
  if paused then still_due = 0 end
  summarize(keys, high_water, cursor, fresh)
  -- On a Cluster (keys.report) the client keeps the summaries: the partition's exact
  -- summary (earliest due, or 0; 1 when events are past the cursor) ends the head.
  local report = ''
  if keys.report then
    report = ',' .. (earliest_due(keys) or '0') .. ',' .. (high_water > cursor and '1' or '0')
  end
  datas[1] = '[' .. int_text(high_water) .. ',' .. int_text(still_due) .. ',' .. deadline_text
    .. ',' .. int_text(redelivered) .. ',[' .. table.concat(items, ',') .. '],' .. int_text(more)
    .. ',' .. range .. ',' .. int_text(keyed and -1 or cursor) .. report .. ']'
  -- For fetch_many (not part of the reply): how many it leased, and `more`.
  datas.leased = #items + range_count
  datas.more = more
  return datas
end
