-- KEYS: G, D, Z, R, B. ARGV: 'all' or JSON [seq, ...]. Returns how many were re-driven.
local G, D, Z, R, B = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local g = redis.call('HMGET', G, 'f')
if not g[1] then return -1 end
local f = tonumber(g[1])
local seqs
if ARGV[1] == 'all' then
  seqs = redis.call('ZRANGE', R, 0, -1)
else
  seqs = {}
  for _, s in ipairs(cjson.decode(ARGV[1])) do
    local sq = S(s)
    if redis.call('ZSCORE', R, sq) then seqs[#seqs + 1] = sq end
  end
end
if #seqs == 0 then return 0 end
local snow = S(now_ms())
local hs, za = {}, {}
local low = nil
local seen = {}
for _, sq in ipairs(seqs) do
  if not seen[sq] then
    seen[sq] = true
    hs[#hs + 1] = sq
    hs[#hs + 1] = 'A|0||||'
    za[#za + 1] = snow
    za[#za + 1] = sq
    local n = tonumber(sq)
    if not low or n < low then low = n end
  end
end
bulk({'HSET', D}, hs)
bulk({'ZADD', Z}, za)
local members = {}
for k = 2, #za, 2 do members[#members + 1] = za[k] end
bulk({'ZREM', R}, members)
if f > low - 1 then
  own_acks(D, B, low, f)
  redis.call('HSET', G, 'f', S(low - 1))
end
return #members
