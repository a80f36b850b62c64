-- KEYS: x, m, i, then G, D, Z, R, B, Y, K, N of each group. ARGV: bound, chunk, want ids (1|0),
-- groups... Removes at most `chunk` events. Returns JSON [removed, more_to_do, [ids]].
local stream_key, meta_key, ids_key = KEYS[1], KEYS[2], KEYS[3]
local meta = redis.call('HMGET', meta_key, 'hw', 'lw')
local high_water, low_water = tonumber(meta[1] or '0'), tonumber(meta[2] or '1')
local bound = math.min(tonumber(ARGV[1]), high_water)
if bound < low_water then return '[0,0,[]]' end
local stop = math.min(bound, low_water + tonumber(ARGV[2]) - 1)
local entries = redis.call('XRANGE', stream_key, entry_id(low_water), entry_id(stop))
local ids = {}
for k, e in ipairs(entries) do
  local entry_fields = e[2]
  local ok, meta = pcall(cjson.decode, entry_fields[2])
  if ok and type(meta) == 'table' then ids[#ids + 1] = meta[1] end
end
if #ids > 0 then bulk({'HDEL', ids_key}, ids) end
redis.call('XTRIM', stream_key, 'MINID', entry_id(stop + 1))
redis.call('HSET', meta_key, 'lw', int_text(stop + 1))
local ngroups = #ARGV - 3
for gi = 1, ngroups do
  local base = 3 + (gi - 1) * 8
  local group_key, records_key, due_key, dead_key = KEYS[base + 1], KEYS[base + 2], KEYS[base + 3], KEYS[base + 4]
  local blocks_key, block_deadlines_key, key_spans_key, key_next_key = KEYS[base + 5], KEYS[base + 6], KEYS[base + 7], KEYS[base + 8]
  local group = ARGV[3 + gi]
  local group_fields = redis.call('HMGET', group_key, 'f', 'c', 'o')
  if group_fields[1] then
    clip_blocks(blocks_key, block_deadlines_key, stop + 1, math.huge)
    local frontier, cursor = tonumber(group_fields[1]), tonumber(group_fields[2])
    hdel_range(records_key, low_water, math.min(stop, cursor))
    drop_active(stream_key, group, due_key, -math.huge, stop)
    redis.call('ZREMRANGEBYSCORE', dead_key, '-inf', stop)
    if group_fields[3] == 'k' then
      -- Trimmed deliveries count as settled: a key whose head is gone passes to its
      -- next delivery past the bound (if any).
      local all = redis.call('HGETALL', key_spans_key)
      local now_text = int_text(now_ms())
      for k = 1, #all, 2 do
        local head, tail = parse_key_span(all[k + 1])
        if tonumber(head) <= stop then
          pass_key(key_spans_key, key_next_key, records_key, due_key, all[k], head, tail, stop, now_text)
        end
      end
    end
    if cursor < stop then
      cursor = stop
      redis.call('XGROUP', 'SETID', stream_key, group, entry_id(cursor))
    end
    if frontier < stop then frontier = stop end
    frontier = advance(records_key, frontier)
    redis.call('HSET', group_key, 'f', int_text(frontier), 'c', int_text(cursor))
  end
end
local more = 0
if stop < bound then more = 1 end
local listed = '[]'
if ARGV[3] == '1' and #ids > 0 then listed = cjson.encode(ids) end
return '[' .. int_text(#entries) .. ',' .. more .. ',' .. listed .. ']'
