-- KEYS: the group partition's x, m, G, D, Z, R, B, Y, K, N. ARGV: group, from_sequence.
local stream_key, meta_key, group_key, records_key, due_key, dead_key, blocks_key, block_deadlines_key, key_spans_key, key_next_key = unpack(KEYS, 1, 10)
local group = ARGV[1]
local group_fields = redis.call('HMGET', group_key, 'f', 'c', 'o')
if not group_fields[1] then return 'NOGROUP' end
local frontier, cursor = tonumber(group_fields[1]), tonumber(group_fields[2])
local low_water = tonumber(redis.call('HGET', meta_key, 'lw') or '1')
-- Trimmed events are gone and count as settled: replay starts at the low water.
local start = math.max(tonumber(ARGV[2]), low_water)
-- A key-ordered group forgets every delivery of a key from `start` on: a key whose head
-- is replayed is free, a key whose head stays keeps its deliveries before `start`.
local function cut_keys()
  local all = redis.call('HGETALL', key_spans_key)
  for i = 1, #all, 2 do
    local k = all[i]
    local head, tail = parse_key_span(all[i + 1])
    local keep = nil
    local nxt = head
    if tonumber(head) < start then keep = head end
    while nxt ~= tail do
      local after = redis.call('HGET', key_next_key, nxt)
      if not after then break end
      if tonumber(after) >= start then
        redis.call('HDEL', key_next_key, nxt)
      elseif keep then
        keep = after
      end
      nxt = after
    end
    if keep then
      redis.call('HSET', key_spans_key, k, head .. '|' .. keep)
    else
      redis.call('HDEL', key_spans_key, k)
    end
  end
end
if start <= cursor then
  if group_fields[3] == 'k' then cut_keys() end
  -- What stays of a block is behind the new frontier exactly when it was behind the old.
  clip_blocks(blocks_key, block_deadlines_key, 0, start - 1)
  drop_active(stream_key, group, due_key, start, math.huge)
  if start <= low_water then
    redis.call('DEL', records_key)
  else
    hdel_range(records_key, start, cursor)
  end
  redis.call('ZREMRANGEBYSCORE', dead_key, start, '+inf')
  cursor = start - 1
  redis.call('XGROUP', 'SETID', stream_key, group, entry_id(cursor))
end
if frontier > start - 1 then frontier = start - 1 end
redis.call('HSET', group_key, 'f', int_text(frontier), 'c', int_text(cursor))
return 'OK'
