-- KEYS: the group partition's x, m, G, D, Z, R, B, Y. ARGV: group, lease_ms,
-- JSON [[seq, receipt, lease_id, consumer]]. Returns "deadline:codes".
local group, lease_ms = ARGV[1], tonumber(ARGV[2])
local leases = cjson.decode(ARGV[3])
local now = now_ms()
local deadline_text = int_text(now + lease_ms)
local group_fields = redis.call('HMGET', group_key, 'f')
if not group_fields[1] then return deadline_text .. ':' .. string.rep('I', #leases) end
local high_water, fields, record_of, block_lease_of = lookup(leases, tonumber(group_fields[1]))
local codes, due_adds, owners, record_writes = {}, {}, {}, {}
for k, lease in ipairs(leases) do
  local seq_text = fields[k]
  local code, state, attempt, lease_id, settled_by = check(lease, record_of[seq_text], high_water)
  if not code then
    if state ~= 'L' then
      code = BY[settled_by] or 'X'
    else
      code = 'o'
      due_adds[#due_adds + 1] = deadline_text
      due_adds[#due_adds + 1] = seq_text
      if block_lease_of[seq_text] then
        -- Leaves its block: its own record and deadline from now on.
        block_lease_of[seq_text] = nil
        record_writes[#record_writes + 1] = seq_text
        record_writes[#record_writes + 1] = record_of[seq_text]
      end
      -- Reset the PEL idle time of our own leases (observability: XPENDING).
      local owner = tostring(lease[4])
      if not owners[owner] then owners[owner] = {} end
      local ids = owners[owner]
      ids[#ids + 1] = seq_text .. '-0'
    end
  end
  codes[k] = code
end
if #due_adds > 0 then
  if #record_writes > 0 then bulk({'HSET', records_key}, record_writes) end
  bulk({'ZADD', due_key}, due_adds)
  for owner, ids in pairs(owners) do
    bulk({'XCLAIM', stream_key, group, owner, '0'}, ids)
  end
end
return deadline_text .. ':' .. table.concat(codes)
