-- append: store events in one partition, each id once.
-- KEYS: stream_key (x), meta_key (m), ids_key (i: event id -> sequence), then on
--   standalone Redis the stream's groups hash (P:groups:<s>) and the name of its groups'
--   `fresh` summaries up to the group (P:new:<s>:; see summary_keys).
-- ARGV: JSON heads [[id, meta, deliver_at], ...] (deliver_at: ms as text, or absent for an event
--   not scheduled), then each row's data text, in the heads' order
--   (the data travels as arguments of its own: the server never decodes it).
-- Reply: 'LOST' (the partition's presence marker is gone), or JSON [time, items]: per row
--   its seq when stored by this call (or earlier in it) at `time`, or
--   [seq, time, meta, data text] when its id was already stored.
local stream_key, meta_key, ids_key = KEYS[1], KEYS[2], KEYS[3]
local groups_key, fresh_head = KEYS[4], KEYS[5]
local rows = cjson.decode(ARGV[1])
-- The fields of a head; a row's data is ARGV[1 + its index].
local ID, META, DELIVER_AT = 1, 2, 3
-- The highest sequence this call stored a scheduled event at (meta field 'sl').
local scheduled_last = nil
local high_water_text, last_time_text, marker =
  unpack(redis.call('HMGET', meta_key, 'hw', 'ts', 'mk'))
if not marker then return 'LOST' end
local high_water, last_time = tonumber(high_water_text or '0'), tonumber(last_time_text or '0')
local now = now_ms()
-- Append times never go backwards within a partition, even if the server clock does.
if now < last_time then now = last_time end
local now_text = int_text(now)
local ids = {}
for k, row in ipairs(rows) do ids[k] = row[ID] end
local known = hmget(ids_key, ids)
-- seq_of: event id -> its sequence (text), stored by this call; id_writes: HSET arguments.
local seq_of, id_writes, items = {}, {}, {}
for k, row in ipairs(rows) do
  local id = row[ID]
  local seq_text = seq_of[id]
  if seq_text then
    items[k] = seq_text
  else
    local stored = nil
    if known[k] then
      local at = entry_id(tonumber(known[k]))
      local entry = redis.call('XRANGE', stream_key, at, at)
      if entry[1] then stored = entry[1][2] end
    end
    if stored then
      items[k] = '[' .. known[k] .. ',' .. stored[ENTRY_TIME] .. ',' .. stored[ENTRY_META] .. ','
        .. cjson.encode(stored[ENTRY_DATA]) .. ']'
    else
      high_water = high_water + 1
      seq_text = int_text(high_water)
      if type(row[DELIVER_AT]) == 'string' then
        redis.call('XADD', stream_key, entry_id(high_water), 'meta', row[META], 'data',
                   ARGV[k + 1], 'time', now_text, 'at', row[DELIVER_AT])
        scheduled_last = high_water
        -- The partition's 't' (KeyLayout.times), in the stream key's slot.
        redis.call('ZADD', (string.gsub(stream_key, ':x$', ':t')), row[DELIVER_AT], seq_text)
      else
        redis.call('XADD', stream_key, entry_id(high_water), 'meta', row[META], 'data',
                   ARGV[k + 1], 'time', now_text)
      end
      seq_of[id] = seq_text
      id_writes[#id_writes + 1] = id
      id_writes[#id_writes + 1] = seq_text
      items[k] = seq_text
    end
  end
end
if #id_writes > 0 then bulk({'HSET', ids_key}, id_writes) end
redis.call('HSET', meta_key, 'hw', int_text(high_water), 'ts', now_text)
if scheduled_last then
  redis.call('HSET', meta_key, 'sl', int_text(scheduled_last))
  redis.call('ZREMRANGEBYSCORE', (string.gsub(stream_key, ':x$', ':t')), '-inf', now_text)
end
if groups_key and #id_writes > 0 then
  local partition = partition_of(stream_key)
  for _, group in ipairs(redis.call('HKEYS', groups_key)) do
    redis.call('SADD', fresh_head .. group, partition)
  end
end
return '[' .. now_text .. ',[' .. table.concat(items, ',') .. ']]'
