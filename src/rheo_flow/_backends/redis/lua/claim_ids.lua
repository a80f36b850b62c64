-- claim_ids: which partition owns each event id of a stream (the first to claim it).
-- KEYS: owners_key (the stream's id index: event id -> partition).
-- ARGV: JSON rows [[id, partition], ...].
-- Reply: the partition that owns each id, comma-separated.
local owners_key = KEYS[1]
local rows = cjson.decode(ARGV[1])
-- The fields of a row.
local ID, PARTITION = 1, 2
local ids = {}
for k, row in ipairs(rows) do ids[k] = row[ID] end
local stored = hmget(owners_key, ids)
-- claimed: id -> partition, claimed by this call; owner_writes: HSET arguments.
local claimed, owner_writes, owners = {}, {}, {}
for k, row in ipairs(rows) do
  local id = row[ID]
  local owner = claimed[id] or stored[k]
  if not owner then
    owner = int_text(row[PARTITION])
    claimed[id] = owner
    owner_writes[#owner_writes + 1] = id
    owner_writes[#owner_writes + 1] = owner
  end
  owners[k] = owner
end
if #owner_writes > 0 then bulk({'HSET', owners_key}, owner_writes) end
return table.concat(owners, ',')
