-- redrive: make dead letters of one group partition due again.
-- KEYS: the group partition's keys (group_keys in common.lua), then on standalone Redis
--   the group's summaries (summary_keys, from KEYS[11]).
-- ARGV: 'all', or JSON [seq, ...].
-- Reply: how many were re-driven (-1: no such group).
local keys = group_keys(1, 3)
keys.summary = summary_keys(11)
local which = ARGV[1]
local frontier_text, ordering = unpack(redis.call('HMGET', keys.group, 'f', 'o'))
if not frontier_text then return -1 end
local frontier = tonumber(frontier_text)
local seq_texts
if which == 'all' then
  seq_texts = redis.call('ZRANGE', keys.dead, 0, -1)
else
  seq_texts = {}
  for _, seq in ipairs(cjson.decode(which)) do
    local seq_text = int_text(seq)
    if redis.call('ZSCORE', keys.dead, seq_text) then seq_texts[#seq_texts + 1] = seq_text end
  end
end
if #seq_texts == 0 then return 0 end
local now_text = int_text(now_ms())
local record_writes, due_adds = {}, {}
-- The lowest sequence re-driven: the frontier moves back before it.
local low = nil
-- The distinct sequences re-driven, in order.
local redriven = {}
local seen = {}
for _, seq_text in ipairs(seq_texts) do
  if not seen[seq_text] then
    seen[seq_text] = true
    redriven[#redriven + 1] = seq_text
    record_writes[#record_writes + 1] = seq_text
    record_writes[#record_writes + 1] = WAITING_RECORD
    due_adds[#due_adds + 1] = now_text
    due_adds[#due_adds + 1] = seq_text
    local seq = tonumber(seq_text)
    if not low or seq < low then low = seq end
  end
end
bulk({'HSET', keys.records}, record_writes)
bulk({'ZADD', keys.due}, due_adds)
note_due(keys, now_text)
bulk({'ZREM', keys.dead}, redriven)
-- A block lease of a sequence (text) past the frontier gets a record of its own, as when
-- its block expires: once it is not its key's head, only that record tells it was leased.
local function own_record(seq_text)
  if tonumber(seq_text) <= frontier or redis.call('HEXISTS', keys.records, seq_text) == 1 then
    return
  end
  local tokens = redis.call('ZRANGE', keys.block_deadlines, 0, -1)
  if #tokens == 0 then return end
  local specs = hmget(keys.blocks, tokens)
  local seq = tonumber(seq_text)
  for k, token in ipairs(tokens) do
    if specs[k] then
      local first, last, deadline_text = parse_block(specs[k])
      if seq >= first and seq <= last then
        redis.call('HSET', keys.records, seq_text, lease_record('1', block_lease_id(token, seq_text)))
        redis.call('ZADD', keys.due, deadline_text, seq_text)
        return
      end
    end
  end
end
if ordering == 'k' then
  -- In a key-ordered group a re-driven delivery takes its place in its key's order: the
  -- head when it is the earliest (a later one already leased keeps its lease), else
  -- linked in after the last earlier one, PARKED until it is the head.
  local parked = {}
  for _, seq_text in ipairs(redriven) do
    local event_key = key_of_seq(keys.stream, seq_text)
    local span = event_key and redis.call('HGET', keys.key_spans, event_key)
    if event_key and not span then
      redis.call('HSET', keys.key_spans, event_key, key_span(seq_text, seq_text))
    elseif span then
      local head, tail = parse_key_span(span)
      local seq = tonumber(seq_text)
      if seq < tonumber(head) then
        own_record(head)
        redis.call('HSET', keys.key_next, seq_text, head)
        redis.call('HSET', keys.key_spans, event_key, key_span(seq_text, tail))
      else
        local prev = head
        local after = prev ~= tail and redis.call('HGET', keys.key_next, prev)
        while after and tonumber(after) < seq do
          prev = after
          after = prev ~= tail and redis.call('HGET', keys.key_next, prev)
        end
        -- A later delivery rejected while an earlier one was redriven ahead of it is
        -- still linked in its place: it stays there (linking it again made it its own
        -- next one, and the key's later deliveries were lost).
        if after ~= seq_text then
          redis.call('HSET', keys.key_next, prev, seq_text)
          if after then redis.call('HSET', keys.key_next, seq_text, after) else tail = seq_text end
          redis.call('HSET', keys.key_spans, event_key, key_span(head, tail))
        end
        parked[#parked + 1] = int_text(PARKED)
        parked[#parked + 1] = seq_text
      end
    end
  end
  if #parked > 0 then bulk({'ZADD', keys.due}, parked) end
end
if frontier > low - 1 then
  own_acks(keys, low, frontier)
  redis.call('HSET', keys.group, 'f', int_text(low - 1))
end
return #redriven
