-- forget_consumers: delete the named Redis consumers of a consumer group that hold
-- nothing (consumer ids are per process: without this they pile up in XINFO CONSUMERS).
-- KEYS: stream_key (x).
-- ARGV: group, then the consumer names.
-- Reply: how many were deleted.
local stream_key, group = KEYS[1], ARGV[1]
local info = redis.pcall('XINFO', 'CONSUMERS', stream_key, group)
if type(info) ~= 'table' or info.err then return 0 end
local wanted = {}
for k = 2, #ARGV do wanted[ARGV[k]] = true end
local deleted = 0
for _, consumer in ipairs(info) do
  local name, pending
  for k = 1, #consumer, 2 do
    local field, value = consumer[k], consumer[k + 1]
    if field == 'name' then name = value elseif field == 'pending' then pending = value end
  end
  if name and wanted[name] and pending == 0 then
    redis.call('XGROUP', 'DELCONSUMER', stream_key, group, name)
    deleted = deleted + 1
  end
end
return deleted
