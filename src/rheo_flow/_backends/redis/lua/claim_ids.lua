-- KEYS: stream-level id index. ARGV: JSON [[id, partition], ...].
-- Returns the partition that owns each id, comma-separated.
local rows = cjson.decode(ARGV[1])
local ids = {}
for k, row in ipairs(rows) do ids[k] = row[1] end
local owners = hmget(KEYS[1], ids)
local seen, new, out = {}, {}, {}
for k, row in ipairs(rows) do
  local p = seen[row[1]] or owners[k]
  if not p then
    p = int_text(row[2])
    seen[row[1]] = p
    new[#new + 1] = row[1]
    new[#new + 1] = p
  end
  out[k] = p
end
if #new > 0 then bulk({'HSET', KEYS[1]}, new) end
return table.concat(out, ',')
