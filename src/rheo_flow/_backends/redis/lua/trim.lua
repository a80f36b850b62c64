-- trim: remove the events of one partition up to a bound, at most `chunk` per call; every
-- group settles what it had of them.
-- KEYS: stream_key (x), meta_key (m), ids_key (i), then on standalone Redis the stream's
--   digest index (P:eid:<s>, see append_many), then the group's own keys (G to N,
--   group_keys in common.lua) of each group, in the order of the groups in ARGV.
-- ARGV: bound, chunk, want ids ('1' or '0'), the partition ('' on a Cluster: no digest
--   index), then the groups.
-- The blobs of large events ({P:s:p}:b:<token>, listed in {P:s:p}:bs; append_many.lua)
-- are deleted with their entries.
-- Reply: JSON [removed, more, ids]: how many events this call removed, 1 when events up
--   to the bound remain (call again), and the ids of the removed events when asked for.
local stream_key, meta_key, ids_key = KEYS[1], KEYS[2], KEYS[3]
local bound, chunk, want_ids = tonumber(ARGV[1]), tonumber(ARGV[2]), ARGV[3] == '1'
local partition = ARGV[4]
local digests_key = partition ~= '' and KEYS[4] or nil
-- ARGV[GROUPS_AT + n] is the n-th group; its keys start at
-- KEYS[group_keys_at + 1 + 8 (n - 1)].
local GROUPS_AT, GROUP_KEY_COUNT = 4, 8
local group_keys_at = digests_key and 4 or 3
-- How many bytes of an id's SHA-1 the digest index keeps (append_many).
local DIGEST_BYTES = 8
local high_water_text, low_water_text = unpack(redis.call('HMGET', meta_key, 'hw', 'lw'))
local high_water, low_water = tonumber(high_water_text or '0'), tonumber(low_water_text or '1')
bound = math.min(bound, high_water)
if bound < low_water then return '[0,0,[]]' end
local stop = math.min(bound, low_water + chunk - 1)
local entries = redis.call('XRANGE', stream_key, entry_id(low_water), entry_id(stop))
local ids, seq_texts = {}, {}
-- The blob of a large event's data (append_many.lua) goes with its entry.
local partition_head = string.sub(stream_key, 1, -2)
local blobs, blob_tokens = {}, {}
for _, entry in ipairs(entries) do
  local data = entry[2][ENTRY_DATA]
  if string.byte(data, 1) == string.byte(BLOB_MARK) then
    blob_tokens[#blob_tokens + 1] = string.sub(data, 2)
    blobs[#blobs + 1] = partition_head .. 'b:' .. blob_tokens[#blob_tokens]
  end
  local ok, meta = pcall(cjson.decode, entry[2][ENTRY_META])
  if ok and type(meta) == 'table' then
    ids[#ids + 1] = meta[1]
    seq_texts[#ids] = string.sub(entry[1], 1, -3)
  end
end
if #blobs > 0 then
  bulk({'DEL'}, blobs)
  bulk({'SREM', partition_head .. 'bs'}, blob_tokens)
end
if #ids > 0 and redis.call('EXISTS', ids_key) == 1 then bulk({'HDEL', ids_key}, ids) end
if digests_key and #ids > 0 then
  -- A digest field is this event's only when it names it (another id may hold it).
  local digests = {}
  for k, id in ipairs(ids) do
    local hex = redis.sha1hex(id)
    local bytes = {}
    for i = 1, DIGEST_BYTES do bytes[i] = tonumber(string.sub(hex, 2 * i - 1, 2 * i), 16) end
    digests[k] = string.char(unpack(bytes))
  end
  local gone = {}
  for k, found in ipairs(hmget(digests_key, digests)) do
    if found == partition .. ':' .. seq_texts[k] then gone[#gone + 1] = digests[k] end
  end
  if #gone > 0 then bulk({'HDEL', digests_key}, gone) end
end
redis.call('XTRIM', stream_key, 'MINID', entry_id(stop + 1))
redis.call('HSET', meta_key, 'lw', int_text(stop + 1))
for n = 1, #ARGV - GROUPS_AT do
  local keys = group_keys(1, group_keys_at + 1 + (n - 1) * GROUP_KEY_COUNT)
  local group = ARGV[GROUPS_AT + n]
  local frontier_text, cursor_text, ordering =
    unpack(redis.call('HMGET', keys.group, 'f', 'c', 'o'))
  if frontier_text then
    clip_blocks(keys, stop + 1, math.huge)
    local frontier, cursor = tonumber(frontier_text), tonumber(cursor_text)
    hdel_range(keys.records, low_water, math.min(stop, cursor))
    drop_active(keys, group, -math.huge, stop)
    redis.call('ZREMRANGEBYSCORE', keys.dead, '-inf', stop)
    if ordering == 'k' then
      -- Trimmed deliveries count as settled: a key whose head is gone passes to its
      -- next delivery past the bound (if any).
      local all = redis.call('HGETALL', keys.key_spans)
      local now_text = int_text(now_ms())
      for k = 1, #all, 2 do
        local head, tail = parse_key_span(all[k + 1])
        if tonumber(head) <= stop then
          pass_key(keys, all[k], head, tail, stop, now_text)
        end
      end
    end
    if cursor < stop then
      cursor = stop
      redis.call('XGROUP', 'SETID', keys.stream, group, entry_id(cursor))
    end
    if frontier < stop then frontier = stop end
    frontier = advance(keys.records, frontier)
    redis.call('HSET', keys.group, 'f', int_text(frontier), 'c', int_text(cursor))
  end
end
local more = 0
if stop < bound then more = 1 end
local listed = '[]'
if want_ids and #ids > 0 then listed = cjson.encode(ids) end
return '[' .. int_text(#entries) .. ',' .. more .. ',' .. listed .. ']'
