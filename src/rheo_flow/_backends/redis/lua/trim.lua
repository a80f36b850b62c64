-- KEYS: x, m, i, then G, D, Z, R, B, Y, K, N of each group. ARGV: bound, chunk, want ids (1|0),
-- groups... Removes at most `chunk` events. Returns JSON [removed, more_to_do, [ids]].
local x, m, i = KEYS[1], KEYS[2], KEYS[3]
local mm = redis.call('HMGET', m, 'hw', 'lw')
local hw, lw = tonumber(mm[1] or '0'), tonumber(mm[2] or '1')
local bound = math.min(tonumber(ARGV[1]), hw)
if bound < lw then return '[0,0,[]]' end
local stop = math.min(bound, lw + tonumber(ARGV[2]) - 1)
local entries = redis.call('XRANGE', x, eid(lw), eid(stop))
local ids = {}
for k, e in ipairs(entries) do
  local fl = e[2]
  local ok, meta = pcall(cjson.decode, fl[2])
  if ok and type(meta) == 'table' then ids[#ids + 1] = meta[1] end
end
if #ids > 0 then bulk({'HDEL', i}, ids) end
redis.call('XTRIM', x, 'MINID', eid(stop + 1))
redis.call('HSET', m, 'lw', S(stop + 1))
local ngroups = #ARGV - 3
for gi = 1, ngroups do
  local base = 3 + (gi - 1) * 8
  local G, D, Z, R = KEYS[base + 1], KEYS[base + 2], KEYS[base + 3], KEYS[base + 4]
  local B, Y, K, N = KEYS[base + 5], KEYS[base + 6], KEYS[base + 7], KEYS[base + 8]
  local group = ARGV[3 + gi]
  local g = redis.call('HMGET', G, 'f', 'c', 'o')
  if g[1] then
    clip(B, Y, stop + 1, math.huge)
    local f, c = tonumber(g[1]), tonumber(g[2])
    hdel_range(D, lw, math.min(stop, c))
    drop_active(x, group, Z, -math.huge, stop)
    redis.call('ZREMRANGEBYSCORE', R, '-inf', stop)
    if g[3] == 'k' then
      -- Trimmed deliveries count as settled: a key whose head is gone passes to its
      -- next delivery past the bound (if any).
      local all = redis.call('HGETALL', K)
      local snow = S(now_ms())
      for k = 1, #all, 2 do
        local head, tail = keyspec(all[k + 1])
        if tonumber(head) <= stop then
          pass_key(K, N, D, Z, all[k], head, tail, stop, snow)
        end
      end
    end
    if c < stop then
      c = stop
      redis.call('XGROUP', 'SETID', x, group, eid(c))
    end
    if f < stop then f = stop end
    f = advance(D, f)
    redis.call('HSET', G, 'f', S(f), 'c', S(c))
  end
end
local more = 0
if stop < bound then more = 1 end
local listed = '[]'
if ARGV[3] == '1' and #ids > 0 then listed = cjson.encode(ids) end
return '[' .. S(#entries) .. ',' .. more .. ',' .. listed .. ']'
