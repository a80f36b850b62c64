-- KEYS: the group partition's x, m, G, D, Z, R, B, Y, K, N. ARGV: 'all' or JSON
-- [seq, ...]. Returns how many were re-driven.
local stream_key, meta_key, group_key, records_key, due_key, dead_key, blocks_key, block_deadlines_key, key_spans_key, key_next_key = unpack(KEYS, 1, 10)
local group_fields = redis.call('HMGET', group_key, 'f', 'o')
if not group_fields[1] then return -1 end
local frontier = tonumber(group_fields[1])
local seqs
if ARGV[1] == 'all' then
  seqs = redis.call('ZRANGE', dead_key, 0, -1)
else
  seqs = {}
  for _, s in ipairs(cjson.decode(ARGV[1])) do
    local seq_text = int_text(s)
    if redis.call('ZSCORE', dead_key, seq_text) then seqs[#seqs + 1] = seq_text end
  end
end
if #seqs == 0 then return 0 end
local now_text = int_text(now_ms())
local record_writes, due_adds = {}, {}
local low = nil
local seen = {}
for _, seq_text in ipairs(seqs) do
  if not seen[seq_text] then
    seen[seq_text] = true
    record_writes[#record_writes + 1] = seq_text
    record_writes[#record_writes + 1] = 'A|0||||'
    due_adds[#due_adds + 1] = now_text
    due_adds[#due_adds + 1] = seq_text
    local n = tonumber(seq_text)
    if not low or n < low then low = n end
  end
end
bulk({'HSET', records_key}, record_writes)
bulk({'ZADD', due_key}, due_adds)
local members = {}
for k = 2, #due_adds, 2 do members[#members + 1] = due_adds[k] end
bulk({'ZREM', dead_key}, members)
-- A block lease of sq (text) past the frontier gets a record of its own, as when its
-- block expires: once sq is not its key's head, only that record tells it was leased.
local function own_record(seq_text)
  if tonumber(seq_text) <= frontier or redis.call('HEXISTS', records_key, seq_text) == 1 then return end
  local tokens = redis.call('ZRANGE', block_deadlines_key, 0, -1)
  if #tokens == 0 then return end
  local specs = hmget(blocks_key, tokens)
  local n = tonumber(seq_text)
  for k, token in ipairs(tokens) do
    if specs[k] then
      local first, last, deadline_text = parse_block(specs[k])
      if n >= first and n <= last then
        redis.call('HSET', records_key, seq_text, 'L|1|' .. token .. ':' .. seq_text .. '|||')
        redis.call('ZADD', due_key, deadline_text, seq_text)
        return
      end
    end
  end
end
if group_fields[2] == 'k' then
  -- In a key-ordered group a re-driven delivery takes its place in its key's order: the
  -- head when it is the earliest (a later one already leased keeps its lease), else
  -- linked in after the last earlier one, parked until it is the head.
  local park = {}
  for _, seq_text in ipairs(members) do
    local k = key_of_seq(stream_key, seq_text)
    local spec = k and redis.call('HGET', key_spans_key, k)
    if k and not spec then
      redis.call('HSET', key_spans_key, k, seq_text .. '|' .. seq_text)
    elseif spec then
      local head, tail = parse_key_span(spec)
      local n = tonumber(seq_text)
      if n < tonumber(head) then
        own_record(head)
        redis.call('HSET', key_next_key, seq_text, head)
        redis.call('HSET', key_spans_key, k, seq_text .. '|' .. tail)
      else
        local prev = head
        local after = prev ~= tail and redis.call('HGET', key_next_key, prev)
        while after and tonumber(after) < n do
          prev = after
          after = prev ~= tail and redis.call('HGET', key_next_key, prev)
        end
        -- A later delivery rejected while an earlier one was redriven ahead of it is
        -- still linked in its place: it stays there (linking it again made it its own
        -- next one, and the key's later deliveries were lost).
        if after ~= seq_text then
          redis.call('HSET', key_next_key, prev, seq_text)
          if after then redis.call('HSET', key_next_key, seq_text, after) else tail = seq_text end
          redis.call('HSET', key_spans_key, k, head .. '|' .. tail)
        end
        park[#park + 1] = int_text(PARKED_SCORE)
        park[#park + 1] = seq_text
      end
    end
  end
  if #park > 0 then bulk({'ZADD', due_key}, park) end
end
if frontier > low - 1 then
  own_acks(records_key, blocks_key, low, frontier)
  redis.call('HSET', group_key, 'f', int_text(low - 1))
end
return #members
