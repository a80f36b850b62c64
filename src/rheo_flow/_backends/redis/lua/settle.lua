-- settle: ack, nack or reject leases of one group partition.
-- KEYS: the group partition's keys (group_keys in common.lua), then on standalone Redis
--   the group's summaries (summary_keys, from KEYS[11]).
-- ARGV: group, op (BY_ACK, BY_NACK or BY_REJECT), reason (then NUL and the error to
--   record, if any), delay_ms, JSON lease rows [[seq, receipt, lease_id, attempt, key],
--   ...] (the key serves key-ordered groups: a delivery settled for good releases its key
--   when it is the key's head); an ack may add the run form of the same leases: block
--   token, first, last (see below).
-- Reply: codes .. woke: one code letter per lease (OK, REPEATED or a failure: lookup.lua,
--   _settle.py), then '+' when releasing a key made its next delivery due now.
-- The attempt only serves the fast path: a lease whose record is exactly
-- lease_record(attempt, lease_id) and whose receipt is its entry id is current, with no
-- parsing. The run form says the leases are exactly block_lease_id(token, seq) with
-- receipt entry_id(seq) for every seq of first..last, in order (the client checked those
-- forms; the script checks the state and falls back to the rows when the run is not the
-- frontier's next one).
local group, op, reason, delay_ms = ARGV[1], ARGV[2], ARGV[3], tonumber(ARGV[4])
local lease_rows = ARGV[5]
local run_token = ARGV[6]
-- The fields of a settle's lease row past lookup.lua's.
local ATTEMPT, EVENT_KEY = 4, 5
local given_error = nil
local cut = string.find(reason, '\0', 1, true)
if cut then
  given_error = string.sub(reason, cut + 1)
  reason = string.sub(reason, 1, cut - 1)
end
-- Deliveries of keys event_keys[i] (not a string: keyless) and sequences seq_texts[i] are
-- settled for good: each releases its key when it is the key's head. The spans of the keys
-- are read at once; a key settled twice in the batch (its later settles then see what the
-- first did) is released one delivery at a time. Returns '+' when that made a delivery
-- due now (the client wakes its idle fetchers of the stream), else ''.
local function release_all(event_keys, seq_texts, now_text)
  local held, first_of, later, free = {}, {}, {}, {}
  for i = 1, #seq_texts do
    local event_key = event_keys[i]
    if type(event_key) == 'string' then
      if first_of[event_key] then
        later[#later + 1] = i
      else
        first_of[event_key] = i
        held[#held + 1] = event_key
      end
    end
  end
  if #held == 0 then return '' end
  local due = false
  for i, span in ipairs(hmget(keys.key_spans, held)) do
    local event_key = held[i]
    local seq_text = seq_texts[first_of[event_key]]
    if span == key_span(seq_text, seq_text) then
      free[#free + 1] = event_key
    elseif span then
      local head, tail = parse_key_span(span)
      if head == seq_text and pass_key(keys, event_key, head, tail, 0, now_text) then
        due = true
      end
    end
  end
  if #free > 0 then bulk({'HDEL', keys.key_spans}, free) end
  for _, i in ipairs(later) do
    if release_key(keys, event_keys[i], seq_texts[i], now_text) then due = true end
  end
  if due then return '+' end
  return ''
end
local frontier_text, max_attempts_text, ordering =
  unpack(redis.call('HMGET', keys.group, 'f', 'ma', 'o'))
local keyed = ordering == 'k'
if frontier_text and run_token and op == BY_ACK then
  -- The run form: every lease of the run is current exactly when its block covers it,
  -- the frontier is right before it and none of its deliveries has a record of its own.
  -- Then the ack moves the frontier over it and writes no record (in a key-ordered group
  -- each keyed delivery of the run is its key's head: released).
  local frontier = tonumber(frontier_text)
  local run_first, run_last = tonumber(ARGV[7]), tonumber(ARGV[8])
  local spec = run_first == frontier + 1 and redis.call('HGET', keys.blocks, run_token)
  if spec then
    local block_first, block_last = parse_block(spec)
    local covered = run_first >= block_first and run_last <= block_last
    local own = false
    if covered and redis.call('HLEN', keys.records) > 0 then
      for _, record in ipairs(hmget(keys.records, seq_fields(run_first, run_last))) do
        if record then own = true break end
      end
    end
    if covered and not own then
      if pel_holds(run_first, run_last) then
        local ids = {}
        for seq = run_first, run_last do ids[#ids + 1] = entry_id(seq) end
        bulk({'XACK', keys.stream, group}, ids)
      end
      local new_frontier = advance(keys.records, run_last)
      redis.call('HSET', keys.group, 'f', int_text(new_frontier))
      -- A block wholly behind the frontier has nothing left to expire.
      if block_last <= new_frontier then redis.call('ZREM', keys.block_deadlines, run_token) end
      local codes = string.rep(OK, run_last - run_first + 1)
      if keyed then
        local event_keys, seq_texts = {}, {}
        for i, lease in ipairs(cjson.decode(lease_rows)) do
          event_keys[i] = lease[EVENT_KEY]
          seq_texts[i] = int_text(lease[SEQ])
        end
        local now_text = int_text(now_ms())
        local woke = release_all(event_keys, seq_texts, now_text)
        if woke ~= '' then note_due(keys, now_text) end
        return codes .. woke
      end
      return codes
    end
  end
end
local leases = cjson.decode(lease_rows)
if not frontier_text then return string.rep(NO_GROUP, #leases) end
local frontier, max_attempts = tonumber(frontier_text), tonumber(max_attempts_text)
local now = now_ms()
local now_text = int_text(now)
local high_water, fields, record_of, block_lease_of, blocks = lookup(leases, frontier)
local codes, record_writes, due_removes, due_adds, dead_adds = {}, {}, {}, {}, {}
-- The entry ids settled for good (for XACK), and their lowest and highest sequence.
local pel_acks, low_acked, high_acked = {}, nil, nil
-- Block leases acked: their records are written only if the frontier does not pass them.
local block_acks = {}
-- The keys and sequences of the deliveries settled for good (key-ordered groups).
local released_keys, released_seqs = {}, {}
local frontier_moves = false
for k, lease in ipairs(leases) do
  local seq, receipt, given_lease_id, given_attempt = lease[SEQ], lease[RECEIPT],
    lease[LEASE_ID], lease[ATTEMPT]
  local seq_text = fields[k]
  local stored = record_of[seq_text]
  local code, state, attempt, lease_id, settled_by, last_error
  if block_lease_of[seq_text] == given_lease_id and receipt == seq_text .. '-0' then
    state, attempt, lease_id = LEASED, 1, given_lease_id
  elseif stored and type(given_attempt) == 'number' and given_attempt % 1 == 0
      and type(given_lease_id) == 'string'
      and stored == lease_record(int_text(given_attempt), given_lease_id)
      and receipt == seq_text .. '-0' then
    state, attempt, lease_id = LEASED, given_attempt, given_lease_id
  else
    code, state, attempt, lease_id, settled_by, last_error = check(lease, stored, high_water)
  end
  if given_error then last_error = given_error end
  if not code then
    if state ~= LEASED then
      if settled_by == op then code = REPEATED
      else code = SETTLED_BY[settled_by] or SETTLED_BY[BY_EXPIRY] end
    else
      code = OK
      local record
      local terminal = true
      if op == BY_ACK then
        record = ack_record(int_text(attempt), lease_id)
      elseif op == BY_REJECT then
        record = record_text(REJECTED, attempt, lease_id, BY_REJECT, now_text, reason,
                             last_error)
      elseif attempt >= max_attempts then
        record = record_text(REJECTED, attempt, lease_id, BY_NACK, now_text, 'max_attempts',
                             last_error)
      else
        record = record_text(AVAILABLE, attempt, lease_id, BY_NACK, '', '', last_error)
        terminal = false
        due_adds[#due_adds + 1] = int_text(now + delay_ms)
        due_adds[#due_adds + 1] = seq_text
      end
      if terminal then
        if not block_lease_of[seq_text] then due_removes[#due_removes + 1] = seq_text end
        pel_acks[#pel_acks + 1] = seq_text .. '-0'
        if not low_acked or seq < low_acked then low_acked = seq end
        if not high_acked or seq > high_acked then high_acked = seq end
        if op ~= BY_ACK then
          dead_adds[#dead_adds + 1] = seq_text
          dead_adds[#dead_adds + 1] = seq_text
        end
        if seq == frontier + 1 then frontier_moves = true end
        if keyed then
          local i = #released_seqs + 1
          released_keys[i] = lease[EVENT_KEY]
          released_seqs[i] = seq_text
        end
      end
      record_of[seq_text] = record
      if block_lease_of[seq_text] and op == BY_ACK then
        block_acks[#block_acks + 1] = seq
      else
        record_writes[#record_writes + 1] = seq_text
        record_writes[#record_writes + 1] = record
      end
      block_lease_of[seq_text] = nil
    end
  end
  codes[k] = code
end
local new_frontier = frontier
if frontier_moves then
  -- This batch's records first (the records hash may hold older ones for them), then
  -- the stored ones.
  while true do
    local record = record_of[int_text(new_frontier + 1)]
    if record then
      if not is_settled(record) then break end
      new_frontier = new_frontier + 1
    else
      local before = new_frontier
      new_frontier = advance(keys.records, new_frontier)
      if new_frontier == before then break end
    end
  end
end
for _, seq in ipairs(block_acks) do
  if seq > new_frontier then
    local seq_text = int_text(seq)
    record_writes[#record_writes + 1] = seq_text
    record_writes[#record_writes + 1] = record_of[seq_text]
  end
end
if #record_writes > 0 then bulk({'HSET', keys.records}, record_writes) end
if #due_removes > 0 then bulk({'ZREM', keys.due}, due_removes) end
if #due_adds > 0 then
  bulk({'ZADD', keys.due}, due_adds)
  -- Every nack of the batch has the same delay: its first score is the earliest.
  note_due(keys, due_adds[1])
end
if #dead_adds > 0 then bulk({'ZADD', keys.dead}, dead_adds) end
if #pel_acks > 0 and pel_holds(low_acked, high_acked) then
  bulk({'XACK', keys.stream, group}, pel_acks)
end
-- After the records: releasing a key reads the records of its later deliveries.
local woke = ''
if #released_seqs > 0 then woke = release_all(released_keys, released_seqs, now_text) end
if woke ~= '' then note_due(keys, now_text) end
if new_frontier > frontier then
  redis.call('HSET', keys.group, 'f', int_text(new_frontier))
  -- A block wholly behind the frontier has nothing left to expire.
  local done = {}
  for token, block in pairs(blocks) do
    if block and block.last <= new_frontier then done[#done + 1] = token end
  end
  if #done > 0 then bulk({'ZREM', keys.block_deadlines}, done) end
end
return table.concat(codes) .. woke
