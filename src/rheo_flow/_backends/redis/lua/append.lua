-- KEYS: x, m, i. ARGV: JSON [[id, meta, data], ...].
-- Returns LOST, or JSON [time, items]: per record its seq when stored by this call (or earlier
-- in it, at `time`), [seq, time, meta, data text] when the id was already stored.
local stream_key, meta_key, ids_key = KEYS[1], KEYS[2], KEYS[3]
local meta = redis.call('HMGET', meta_key, 'hw', 'ts', 'mk')
if not meta[3] then return 'LOST' end
local rows = cjson.decode(ARGV[1])
local high_water, ts = tonumber(meta[1] or '0'), tonumber(meta[2] or '0')
local now = now_ms()
-- Append times never go backwards within a partition, even if the server clock does.
if now < ts then now = ts end
local now_text = int_text(now)
local ids = {}
for k, row in ipairs(rows) do ids[k] = row[1] end
local known = hmget(ids_key, ids)
local seen, new, out = {}, {}, {}
for k, row in ipairs(rows) do
  local id = row[1]
  local seq_text = seen[id]
  if seq_text then
    out[k] = seq_text
  else
    local stored = nil
    if known[k] then
      local e = redis.call('XRANGE', stream_key, entry_id(tonumber(known[k])), entry_id(tonumber(known[k])))
      if e[1] then stored = e[1][2] end
    end
    if stored then
      out[k] = '[' .. known[k] .. ',' .. stored[6] .. ',' .. stored[2] .. ','
        .. cjson.encode(stored[4]) .. ']'
    else
      high_water = high_water + 1
      seq_text = int_text(high_water)
      redis.call('XADD', stream_key, entry_id(high_water), 'meta', row[2], 'data', row[3], 'time', now_text)
      seen[id] = seq_text
      new[#new + 1] = id
      new[#new + 1] = seq_text
      out[k] = seq_text
    end
  end
end
if #new > 0 then bulk({'HSET', ids_key}, new) end
redis.call('HSET', meta_key, 'hw', int_text(high_water), 'ts', now_text)
return '[' .. now_text .. ',[' .. table.concat(out, ',') .. ']]'
