-- replay: take a group partition back to a sequence: everything from it on is delivered
-- again.
-- KEYS: the group partition's keys (group_keys in common.lua), then on standalone Redis
--   the group's summaries (summary_keys, from KEYS[11]).
-- ARGV: group, from_sequence.
-- Reply: 'OK', or 'NOGROUP'.
local keys = group_keys(1, 3)
keys.summary = summary_keys(11)
local group, from_sequence = ARGV[1], tonumber(ARGV[2])
local frontier_text, cursor_text, ordering =
  unpack(redis.call('HMGET', keys.group, 'f', 'c', 'o'))
if not frontier_text then return 'NOGROUP' end
local frontier, cursor = tonumber(frontier_text), tonumber(cursor_text)
local low_water = tonumber(redis.call('HGET', keys.meta, 'lw') or '1')
-- Trimmed events are gone and count as settled: replay starts at the low water.
local start = math.max(from_sequence, low_water)
-- A key-ordered group forgets every delivery of a key from `start` on: a key whose head
-- is replayed is no longer held, a key whose head stays keeps its deliveries before
-- `start`.
local function cut_keys()
  local all = redis.call('HGETALL', keys.key_spans)
  for i = 1, #all, 2 do
    local event_key = all[i]
    local head, tail = parse_key_span(all[i + 1])
    local keep = nil
    local nxt = head
    if tonumber(head) < start then keep = head end
    while nxt ~= tail do
      local after = redis.call('HGET', keys.key_next, nxt)
      if not after then break end
      if tonumber(after) >= start then
        redis.call('HDEL', keys.key_next, nxt)
      elseif keep then
        keep = after
      end
      nxt = after
    end
    if keep then
      redis.call('HSET', keys.key_spans, event_key, key_span(head, keep))
    else
      redis.call('HDEL', keys.key_spans, event_key)
    end
  end
end
if start <= cursor then
  if ordering == 'k' then cut_keys() end
  -- What stays of a block is behind the new frontier exactly when it was behind the old.
  clip_blocks(keys, 0, start - 1)
  drop_active(keys, group, start, math.huge)
  if start <= low_water then
    redis.call('DEL', keys.records)
  else
    hdel_range(keys.records, start, cursor)
  end
  redis.call('ZREMRANGEBYSCORE', keys.dead, start, '+inf')
  cursor = start - 1
  redis.call('XGROUP', 'SETID', keys.stream, group, entry_id(cursor))
end
if frontier > start - 1 then frontier = start - 1 end
redis.call('HSET', keys.group, 'f', int_text(frontier), 'c', int_text(cursor))
note_fresh(keys)
return 'OK'
