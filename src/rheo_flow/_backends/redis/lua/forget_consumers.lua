-- KEYS: x. ARGV: group, consumer names... Deletes the named Redis consumers that hold
-- nothing (consumer ids are per process: without this they pile up in XINFO CONSUMERS).
local info = redis.pcall('XINFO', 'CONSUMERS', KEYS[1], ARGV[1])
if type(info) ~= 'table' or info.err then return 0 end
local wanted = {}
for k = 2, #ARGV do wanted[ARGV[k]] = true end
local n = 0
for _, consumer in ipairs(info) do
  local name, pending
  for k = 1, #consumer, 2 do
    if consumer[k] == 'name' then name = consumer[k + 1] elseif consumer[k] == 'pending' then pending = consumer[k + 1] end
  end
  if name and wanted[name] and pending == 0 then
    redis.call('XGROUP', 'DELCONSUMER', KEYS[1], ARGV[1], name)
    n = n + 1
  end
end
return n
