-- append_many: store events in the partitions of one stream, each id once (standalone
--   Redis: it writes keys of several partitions, which it names from the tag head).
-- KEYS: digests_key (P:eid:<s>: the first 8 bytes of the SHA-1 of an event id ->
--   'partition:seq'), exact_owners_key (P:ids:<s>: event id -> partition), groups_key
--   (P:groups:<s>).
-- ARGV: tag head ('{P:s:'), the groups' `fresh` summaries' name up to the group
--   (P:new:<s>:; see summary_keys), partition count, JSON rows [[id, meta, partition,
--   blob, deliver_at], ...] (deliver_at: ms as text, or absent for an event not scheduled), the rows' digests (8 bytes each, in row order, as one string), then each
--   row's data text, in the rows' order (the server never decodes it; '' for a blob row).
--   blob: null, or the token of a large row's data, which the client SET in the same
--   MULTI at {P:s:p}:b:<token> of its partition (so that the data never passes through
--   Lua, whose copies of an argument cost more than the whole XADD).
-- Reply: 'LOST' (a partition's presence marker is gone: nothing was written), or JSON
--   [times, items]: times [[partition, time], ...] of the partitions this call appended
--   to; per row [partition, seq] when stored by this call (or earlier in it), or
--   [partition, seq, time, meta, data text] when its id was already stored.
-- A blob row's entry holds BLOB_MARK .. token as its data (never JSON text), and the
-- partition's {P:s:p}:bs the token (trim and delete_stream remove the blob); a blob row
-- not appended (its id was stored already, or the store was lost) has its blob deleted.
-- An id found through its digest is checked against the entry's id. The ids whose digest
-- another id holds, and those releases before the digest index stored, are in the exact
-- indexes: exact_owners_key (streams with several partitions) and each partition's
-- i (event id -> sequence).
local digests_key, exact_owners_key, groups_key = KEYS[1], KEYS[2], KEYS[3]
local tag_head, fresh_head = ARGV[1], ARGV[2]
local partition_count = tonumber(ARGV[3])
local rows = cjson.decode(ARGV[4])
local digest_blob = ARGV[5]
-- The fields of a row; a row's data is ARGV[DATA_AT + its index].
local ID, META, PARTITION, BLOB, DELIVER_AT = 1, 2, 3, 4, 5
-- Per partition, the highest sequence this call stored a scheduled event at (meta 'sl').
local scheduled_last = {}
local DATA_AT, DIGEST_BYTES = 5, 8
-- Delete the blobs of the rows from `from` on that were not appended (appended: nil).
local function drop_blobs(from, kept)
  for k = from, #rows do
    local token = rows[k][BLOB]
    if type(token) == 'string' and not (kept and kept[k]) then
      redis.call('DEL', tag_head .. int_text(rows[k][PARTITION]) .. '}:b:' .. token)
    end
  end
end
local key_cache = {}
local function partition_key(partition, suffix)
  local name = partition .. suffix
  local key = key_cache[name]
  if not key then
    key = tag_head .. partition .. '}:' .. suffix
    key_cache[name] = key
  end
  return key
end
-- The partitions the rows go to: their high water, time (and as text), stream key, and
-- whether they got an event; partition_of_row: each row's partition as text.
local high_water_of, time_of, time_text_of, stream_key_of, appended = {}, {}, {}, {}, {}
local partition_of_row = {}
local now = now_ms()
for k, row in ipairs(rows) do
  local partition = int_text(row[PARTITION])
  partition_of_row[k] = partition
  if not high_water_of[partition] then
    local high_water_text, last_time_text, marker =
      unpack(redis.call('HMGET', partition_key(partition, 'm'), 'hw', 'ts', 'mk'))
    if not marker then
      drop_blobs(1, nil)
      return 'LOST'
    end
    high_water_of[partition] = tonumber(high_water_text or '0')
    -- Append times never go backwards within a partition, even if the server clock does.
    time_of[partition] = math.max(now, tonumber(last_time_text or '0'))
    time_text_of[partition] = int_text(time_of[partition])
    stream_key_of[partition] = partition_key(partition, 'x')
  end
end
local digests = {}
for k = 1, #rows do
  digests[k] = string.sub(digest_blob, (k - 1) * DIGEST_BYTES + 1, k * DIGEST_BYTES)
end
local by_digest = hmget(digests_key, digests)
-- The exact indexes, read only where they exist (collisions, or data of a release before).
local exact_owners = redis.call('EXISTS', exact_owners_key) == 1
local single_exact = partition_count == 1
  and redis.call('EXISTS', partition_key('0', 'i')) == 1
-- The stored entry of a partition and sequence (text), when the stream still holds it.
local function entry_of(partition, seq_text)
  local at = entry_id(tonumber(seq_text))
  local entry = redis.call('XRANGE', partition_key(partition, 'x'), at, at)
  if entry[1] then return entry[1][2] end
  return nil
end
-- The stored partition, sequence and entry of an id in the exact indexes, or nil.
local function exact_entry(id)
  local partition = nil
  if exact_owners then partition = redis.call('HGET', exact_owners_key, id)
  elseif single_exact then partition = '0' end
  if not partition then return nil end
  local seq_text = redis.call('HGET', partition_key(partition, 'i'), id)
  local entry_fields = seq_text and entry_of(partition, seq_text)
  if entry_fields then return partition, seq_text, entry_fields end
  return nil
end
-- item_of: event id -> its item, stored by this call; digest_taken: digests this call
-- indexed; digest_writes, owner_writes, exact_writes (partition -> id, seq, ...): HSETs.
local item_of, digest_taken, digest_writes, owner_writes, exact_writes, items =
  {}, {}, {}, {}, {}, {}
-- The rows whose blob an entry now names.
local blob_kept = {}
for k, row in ipairs(rows) do
  local id = row[ID]
  local item = item_of[id]
  if not item then
    local partition, seq_text, stored, digest_held = nil, nil, nil, false
    local found = by_digest[k]
    if found then
      partition, seq_text = string.match(found, '^(%d+):(%d+)$')
      local entry_fields = entry_of(partition, seq_text)
      if entry_fields then
        local ok, meta = pcall(cjson.decode, entry_fields[ENTRY_META])
        if ok and type(meta) == 'table' and meta[1] == id then
          stored = entry_fields
        else
          -- Another id with the same digest holds the field.
          digest_held = true
        end
      end
    end
    if not stored and (exact_owners or single_exact) then
      partition, seq_text, stored = exact_entry(id)
    end
    if stored then
      item = '[' .. partition .. ',' .. seq_text .. ',' .. stored[ENTRY_TIME] .. ','
        .. stored[ENTRY_META] .. ',' .. cjson.encode(stored[ENTRY_DATA]) .. ']'
    else
      partition = partition_of_row[k]
      local seq = high_water_of[partition] + 1
      high_water_of[partition] = seq
      appended[partition] = true
      seq_text = int_text(seq)
      local data = ARGV[DATA_AT + k]
      if type(row[BLOB]) == 'string' then
        data = BLOB_MARK .. row[BLOB]
        blob_kept[k] = true
        redis.call('SADD', partition_key(partition, 'bs'), row[BLOB])
      end
      if type(row[DELIVER_AT]) == 'string' then
        redis.call('XADD', stream_key_of[partition], entry_id(seq), 'meta', row[META],
                   'data', data, 'time', time_text_of[partition], 'at',
                   row[DELIVER_AT])
        scheduled_last[partition] = seq_text
        redis.call('ZADD', partition_key(partition, 't'), row[DELIVER_AT], seq_text)
      else
        redis.call('XADD', stream_key_of[partition], entry_id(seq), 'meta', row[META],
                   'data', data, 'time', time_text_of[partition])
      end
      local digest = digests[k]
      if digest_held or digest_taken[digest] then
        local writes = exact_writes[partition] or {}
        exact_writes[partition] = writes
        writes[#writes + 1] = id
        writes[#writes + 1] = seq_text
        if partition_count > 1 then
          owner_writes[#owner_writes + 1] = id
          owner_writes[#owner_writes + 1] = partition
        end
      else
        digest_taken[digest] = true
        digest_writes[#digest_writes + 1] = digest
        digest_writes[#digest_writes + 1] = partition .. ':' .. seq_text
      end
      item = '[' .. partition .. ',' .. seq_text .. ']'
    end
    item_of[id] = item
  end
  items[k] = item
end
drop_blobs(1, blob_kept)
if #digest_writes > 0 then bulk({'HSET', digests_key}, digest_writes) end
if #owner_writes > 0 then bulk({'HSET', exact_owners_key}, owner_writes) end
for partition, writes in pairs(exact_writes) do
  bulk({'HSET', partition_key(partition, 'i')}, writes)
end
local times = {}
local groups = nil
for partition in pairs(appended) do
  local time_text = time_text_of[partition]
  redis.call('HSET', partition_key(partition, 'm'), 'hw', int_text(high_water_of[partition]),
             'ts', time_text)
  if scheduled_last[partition] then
    redis.call('HSET', partition_key(partition, 'm'), 'sl', scheduled_last[partition])
    redis.call('ZREMRANGEBYSCORE', partition_key(partition, 't'), '-inf', time_text)
  end
  times[#times + 1] = '[' .. partition .. ',' .. time_text .. ']'
  groups = groups or redis.call('HKEYS', groups_key)
  for _, group in ipairs(groups) do redis.call('SADD', fresh_head .. group, partition) end
end
return '[[' .. table.concat(times, ',') .. '],[' .. table.concat(items, ',') .. ']]'
