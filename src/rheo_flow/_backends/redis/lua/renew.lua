-- renew: extend leases of one group partition.
-- KEYS: the group partition's keys (group_keys in common.lua), then on standalone Redis
--   the group's summaries (summary_keys, from KEYS[11]).
-- ARGV: group, lease_ms, JSON lease rows [[seq, receipt, lease_id, consumer], ...].
-- Reply: deadline .. ':' .. codes: the new deadline (ms), then one code letter per lease
--   (OK or a failure: lookup.lua, _settle.py).
local group, lease_ms, leases = ARGV[1], tonumber(ARGV[2]), cjson.decode(ARGV[3])
-- The field of a renew's lease row past lookup.lua's.
local CONSUMER = 4
local now = now_ms()
local deadline_text = int_text(now + lease_ms)
local frontier_text = redis.call('HGET', keys.group, 'f')
if not frontier_text then return deadline_text .. ':' .. string.rep(NO_GROUP, #leases) end
local high_water, fields, record_of, block_lease_of = lookup(leases, tonumber(frontier_text))
local codes, due_adds, record_writes = {}, {}, {}
-- Consumer name -> the entry ids of its leases renewed.
local ids_of = {}
for k, lease in ipairs(leases) do
  local seq_text = fields[k]
  local code, state, _, _, settled_by = check(lease, record_of[seq_text], high_water)
  if not code then
    if state ~= LEASED then
      code = SETTLED_BY[settled_by] or SETTLED_BY[BY_EXPIRY]
    else
      code = OK
      due_adds[#due_adds + 1] = deadline_text
      due_adds[#due_adds + 1] = seq_text
      if block_lease_of[seq_text] then
        -- Leaves its block: its own record and deadline from now on.
        block_lease_of[seq_text] = nil
        record_writes[#record_writes + 1] = seq_text
        record_writes[#record_writes + 1] = record_of[seq_text]
      end
      -- Reset the PEL idle time of our own leases (observability: XPENDING).
      local owner = tostring(lease[CONSUMER])
      if not ids_of[owner] then ids_of[owner] = {} end
      local ids = ids_of[owner]
      ids[#ids + 1] = seq_text .. '-0'
    end
  end
  codes[k] = code
end
if #due_adds > 0 then
  if #record_writes > 0 then bulk({'HSET', keys.records}, record_writes) end
  bulk({'ZADD', keys.due}, due_adds)
  note_due(keys, deadline_text)
  for owner, ids in pairs(ids_of) do
    bulk({'XCLAIM', keys.stream, group, owner, '0'}, ids)
  end
end
return deadline_text .. ':' .. table.concat(codes)
