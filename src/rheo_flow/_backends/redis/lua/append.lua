-- KEYS: x, m, i. ARGV: JSON [[id, meta, data], ...].
-- Returns LOST, or JSON [time, items]: per record its seq when stored by this call (or earlier
-- in it, at `time`), [seq, time, meta, data text] when the id was already stored.
local x, m, i = KEYS[1], KEYS[2], KEYS[3]
local mm = redis.call('HMGET', m, 'hw', 'ts', 'mk')
if not mm[3] then return 'LOST' end
local recs = cjson.decode(ARGV[1])
local hw, ts = tonumber(mm[1] or '0'), tonumber(mm[2] or '0')
local now = now_ms()
-- Append times never go backwards within a partition, even if the server clock does.
if now < ts then now = ts end
local snow = S(now)
local ids = {}
for k, r in ipairs(recs) do ids[k] = r[1] end
local known = hmget(i, ids)
local seen, new, out = {}, {}, {}
for k, r in ipairs(recs) do
  local id = r[1]
  local sq = seen[id]
  if sq then
    out[k] = sq
  else
    local stored = nil
    if known[k] then
      local e = redis.call('XRANGE', x, eid(tonumber(known[k])), eid(tonumber(known[k])))
      if e[1] then stored = e[1][2] end
    end
    if stored then
      out[k] = '[' .. known[k] .. ',' .. stored[6] .. ',' .. stored[2] .. ','
        .. cjson.encode(stored[4]) .. ']'
    else
      hw = hw + 1
      sq = S(hw)
      redis.call('XADD', x, eid(hw), 'meta', r[2], 'data', r[3], 'time', snow)
      seen[id] = sq
      new[#new + 1] = id
      new[#new + 1] = sq
      out[k] = sq
    end
  end
end
if #new > 0 then bulk({'HSET', i}, new) end
redis.call('HSET', m, 'hw', S(hw), 'ts', snow)
return '[' .. snow .. ',[' .. table.concat(out, ',') .. ']]'
