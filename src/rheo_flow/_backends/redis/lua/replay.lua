-- KEYS: the group partition's x, m, G, D, Z, R, B, Y, K, N. ARGV: group, from_sequence.
local x, m, G, D, Z, R, B, Y, K, N = unpack(KEYS, 1, 10)
local group = ARGV[1]
local g = redis.call('HMGET', G, 'f', 'c', 'o')
if not g[1] then return 'NOGROUP' end
local f, c = tonumber(g[1]), tonumber(g[2])
local lw = tonumber(redis.call('HGET', m, 'lw') or '1')
-- Trimmed events are gone and count as settled: replay starts at the low water.
local start = math.max(tonumber(ARGV[2]), lw)
-- A key-ordered group forgets every delivery of a key from `start` on: a key whose head
-- is replayed is free, a key whose head stays keeps its deliveries before `start`.
local function cut_keys()
  local all = redis.call('HGETALL', K)
  for i = 1, #all, 2 do
    local k = all[i]
    local head, tail = keyspec(all[i + 1])
    local keep = nil
    local nxt = head
    if tonumber(head) < start then keep = head end
    while nxt ~= tail do
      local after = redis.call('HGET', N, nxt)
      if not after then break end
      if tonumber(after) >= start then
        redis.call('HDEL', N, nxt)
      elseif keep then
        keep = after
      end
      nxt = after
    end
    if keep then
      redis.call('HSET', K, k, head .. '|' .. keep)
    else
      redis.call('HDEL', K, k)
    end
  end
end
if start <= c then
  if g[3] == 'k' then cut_keys() end
  -- What stays of a block is behind the new frontier exactly when it was behind the old.
  clip(B, Y, 0, start - 1)
  drop_active(x, group, Z, start, math.huge)
  if start <= lw then
    redis.call('DEL', D)
  else
    hdel_range(D, start, c)
  end
  redis.call('ZREMRANGEBYSCORE', R, start, '+inf')
  c = start - 1
  redis.call('XGROUP', 'SETID', x, group, eid(c))
end
if f > start - 1 then f = start - 1 end
redis.call('HSET', G, 'f', S(f), 'c', S(c))
return 'OK'
