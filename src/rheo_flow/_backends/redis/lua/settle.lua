-- KEYS: the group partition's x, m, G, D, Z, R, B, Y, K, N. ARGV: group, op (a|n|r),
-- reason (then NUL and the error to record, if any), delay_ms,
-- JSON [[seq, receipt, lease_id, attempt, key], ...] (the key serves key-ordered groups:
-- a delivery settled for good releases its key when it is the key's head). Returns one
-- code letter per lease (see _settle.py), then '+' when releasing a key made its next
-- delivery due now. The attempt only serves the fast path: a
-- lease whose record is exactly 'L|attempt|lease_id|||' and whose receipt is its entry
-- id is current, with no parsing.
-- An ack may add the run form of the same leases: block token t, first, last: the
-- leases are exactly '<t>:<seq>' with receipt '<seq>-0' for every seq of first..last,
-- in order (the client checked those forms; the script checks the state and falls back
-- to the JSON when the run is not the frontier's next one).
local group, op, reason, delay_ms = ARGV[1], ARGV[2], ARGV[3], tonumber(ARGV[4])
local given_error = nil
local cut = string.find(reason, '\0', 1, true)
if cut then
  given_error = string.sub(reason, cut + 1)
  reason = string.sub(reason, 1, cut - 1)
end
local key_spans_key, key_next_key = KEYS[9], KEYS[10]
-- Deliveries of keys ks[i] (not a string: keyless) and sequences sqs[i] (text) are settled
-- for good: each releases its key when it is the key's head. The state of the keys is
-- read at once; a key settled twice in the batch (its later settles then see what the
-- first did) is released one delivery at a time. Returns '+' when that made a delivery
-- due now (the client wakes its idle fetchers of the stream), else ''.
local function release_all(ks, sqs, now_text)
  local keys, firsts, later, free = {}, {}, {}, {}
  for i = 1, #sqs do
    local key = ks[i]
    if type(key) == 'string' then
      if firsts[key] then
        later[#later + 1] = i
      else
        firsts[key] = i
        keys[#keys + 1] = key
      end
    end
  end
  if #keys == 0 then return '' end
  local due = false
  for i, spec in ipairs(hmget(key_spans_key, keys)) do
    local key = keys[i]
    local seq_text = sqs[firsts[key]]
    if spec == seq_text .. '|' .. seq_text then
      free[#free + 1] = key
    elseif spec then
      local head, tail = parse_key_span(spec)
      if head == seq_text and pass_key(key_spans_key, key_next_key, records_key, due_key, key, head, tail, 0, now_text) then due = true end
    end
  end
  if #free > 0 then bulk({'HDEL', key_spans_key}, free) end
  for _, i in ipairs(later) do
    if release_key(key_spans_key, key_next_key, records_key, due_key, ks[i], sqs[i], now_text) then due = true end
  end
  if due then return '+' end
  return ''
end
local group_fields = redis.call('HMGET', group_key, 'f', 'ma', 'o')
local keyed = group_fields[3] == 'k'
if group_fields[1] and ARGV[6] and op == 'a' then
  -- The run form (see above): every lease of the run is current exactly when its block
  -- covers it, the frontier is right before it and none of its deliveries has a
  -- record of its own. Then the ack moves the frontier over it and writes no record
  -- (in a key-ordered group each keyed delivery of the run is its key's head: released).
  local frontier = tonumber(group_fields[1])
  local first, last = tonumber(ARGV[7]), tonumber(ARGV[8])
  local spec = first == frontier + 1 and redis.call('HGET', blocks_key, ARGV[6])
  if spec then
    local bf, bl = parse_block(spec)
    local own = false
    if first >= bf and last <= bl and redis.call('HLEN', records_key) > 0 then
      for _, record in ipairs(hmget(records_key, seq_fields(first, last))) do
        if record then own = true break end
      end
    end
    if first >= bf and last <= bl and not own then
      if pel_holds(first, last) then
        local ids = {}
        for n = first, last do ids[#ids + 1] = entry_id(n) end
        bulk({'XACK', stream_key, group}, ids)
      end
      local new_frontier = advance(records_key, last)
      redis.call('HSET', group_key, 'f', int_text(new_frontier))
      -- A block wholly behind the frontier has nothing left to expire.
      if bl <= new_frontier then redis.call('ZREM', block_deadlines_key, ARGV[6]) end
      if keyed then
        local ks, sqs = {}, {}
        for i, lease in ipairs(cjson.decode(ARGV[5])) do
          ks[i] = lease[5]
          sqs[i] = int_text(lease[1])
        end
        return string.rep('o', last - first + 1) .. release_all(ks, sqs, int_text(now_ms()))
      end
      return string.rep('o', last - first + 1)
    end
  end
end
local leases = cjson.decode(ARGV[5])
if not group_fields[1] then return string.rep('I', #leases) end
local frontier, max_attempts = tonumber(group_fields[1]), tonumber(group_fields[2])
local now = now_ms()
local now_text = int_text(now)
local high_water, fields, record_of, block_lease_of, blocks = lookup(leases, frontier)
local codes, record_writes, due_removes, due_adds, dead_adds, pel_acks, block_acks = {}, {}, {}, {}, {}, {}, {}
-- The lowest and highest sequence in acks.
local low_acked, high_acked = nil, nil
-- The keys and sequences of the deliveries settled for good (key-ordered groups).
local released_keys, released_seqs = {}, {}
local frontier_moves = false
for k, lease in ipairs(leases) do
  local seq_text = fields[k]
  local stored = record_of[seq_text]
  local code, state, attempt, lease_id, settled_by, last_error
  local a = lease[4]
  if block_lease_of[seq_text] == lease[3] and lease[2] == seq_text .. '-0' then
    state, attempt, lease_id = 'L', 1, lease[3]
  elseif stored and type(a) == 'number' and a % 1 == 0 and type(lease[3]) == 'string'
      and stored == 'L|' .. int_text(a) .. '|' .. lease[3] .. '|||' and lease[2] == seq_text .. '-0' then
    state, attempt, lease_id = 'L', a, lease[3]
  else
    code, state, attempt, lease_id, settled_by, last_error = check(lease, stored, high_water)
  end
  if given_error then last_error = given_error end
  if not code then
    if state ~= 'L' then
      if settled_by == op then code = 'r' else code = BY[settled_by] or 'X' end
    else
      code = 'o'
      local record
      local terminal = true
      if op == 'a' then
        record = 'K|' .. int_text(attempt) .. '|' .. lease_id .. '|a||'
      elseif op == 'r' then
        record = record_text('R', attempt, lease_id, 'r', now_text, reason, last_error)
      elseif attempt >= max_attempts then
        record = record_text('R', attempt, lease_id, 'n', now_text, 'max_attempts', last_error)
      else
        record = record_text('A', attempt, lease_id, 'n', '', '', last_error)
        terminal = false
        due_adds[#due_adds + 1] = int_text(now + delay_ms)
        due_adds[#due_adds + 1] = seq_text
      end
      if terminal then
        if not block_lease_of[seq_text] then due_removes[#due_removes + 1] = seq_text end
        pel_acks[#pel_acks + 1] = seq_text .. '-0'
        if not low_acked or lease[1] < low_acked then low_acked = lease[1] end
        if not high_acked or lease[1] > high_acked then high_acked = lease[1] end
        if op ~= 'a' then
          dead_adds[#dead_adds + 1] = seq_text
          dead_adds[#dead_adds + 1] = seq_text
        end
        if lease[1] == frontier + 1 then frontier_moves = true end
        if keyed then
          local i = #released_seqs + 1
          released_keys[i] = lease[5]
          released_seqs[i] = seq_text
        end
      end
      record_of[seq_text] = record
      if block_lease_of[seq_text] and op == 'a' then
        -- Written below only if the frontier does not pass it.
        block_acks[#block_acks + 1] = lease
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
  -- This batch's records first (D may hold older ones for them), then D's.
  while true do
    local record = record_of[int_text(new_frontier + 1)]
    if record then
      local b = string.byte(record, 1)
      if b ~= 75 and b ~= 82 then break end
      new_frontier = new_frontier + 1
    else
      local before = new_frontier
      new_frontier = advance(records_key, new_frontier)
      if new_frontier == before then break end
    end
  end
end
for _, lease in ipairs(block_acks) do
  if lease[1] > new_frontier then
    local seq_text = int_text(lease[1])
    record_writes[#record_writes + 1] = seq_text
    record_writes[#record_writes + 1] = record_of[seq_text]
  end
end
if #record_writes > 0 then bulk({'HSET', records_key}, record_writes) end
if #due_removes > 0 then bulk({'ZREM', due_key}, due_removes) end
if #due_adds > 0 then bulk({'ZADD', due_key}, due_adds) end
if #dead_adds > 0 then bulk({'ZADD', dead_key}, dead_adds) end
if #pel_acks > 0 and pel_holds(low_acked, high_acked) then bulk({'XACK', stream_key, group}, pel_acks) end
-- After the records: releasing a key reads the records of its later deliveries.
local woke = ''
if #released_seqs > 0 then woke = release_all(released_keys, released_seqs, now_text) end
if new_frontier > frontier then
  redis.call('HSET', group_key, 'f', int_text(new_frontier))
  -- A block wholly behind the frontier has nothing left to expire.
  local done = {}
  for token, b in pairs(blocks) do
    if b and b[2] <= new_frontier then done[#done + 1] = token end
  end
  if #done > 0 then bulk({'ZREM', block_deadlines_key}, done) end
end
return table.concat(codes) .. woke
