-- KEYS: stream-level id index. ARGV: JSON [[id, partition], ...].
-- Returns the partition that owns each id, comma-separated.
local recs = cjson.decode(ARGV[1])
local ids = {}
for k, r in ipairs(recs) do ids[k] = r[1] end
local cur = hmget(KEYS[1], ids)
local seen, new, out = {}, {}, {}
for k, r in ipairs(recs) do
  local p = seen[r[1]] or cur[k]
  if not p then
    p = S(r[2])
    seen[r[1]] = p
    new[#new + 1] = r[1]
    new[#new + 1] = p
  end
  out[k] = p
end
if #new > 0 then bulk({'HSET', KEYS[1]}, new) end
return table.concat(out, ',')
