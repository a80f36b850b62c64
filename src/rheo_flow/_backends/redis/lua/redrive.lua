-- KEYS: the group partition's x, m, G, D, Z, R, B, Y, K, N. ARGV: 'all' or JSON
-- [seq, ...]. Returns how many were re-driven.
local x, m, G, D, Z, R, B, Y, K, N = unpack(KEYS, 1, 10)
local g = redis.call('HMGET', G, 'f', 'o')
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
-- A block lease of sq (text) past the frontier gets a record of its own, as when its
-- block expires: once sq is not its key's head, only that record tells it was leased.
local function own_record(sq)
  if tonumber(sq) <= f or redis.call('HEXISTS', D, sq) == 1 then return end
  local tokens = redis.call('ZRANGE', Y, 0, -1)
  if #tokens == 0 then return end
  local specs = hmget(B, tokens)
  local n = tonumber(sq)
  for k, t in ipairs(tokens) do
    if specs[k] then
      local first, last, dl = blockspec(specs[k])
      if n >= first and n <= last then
        redis.call('HSET', D, sq, 'L|1|' .. t .. ':' .. sq .. '|||')
        redis.call('ZADD', Z, dl, sq)
        return
      end
    end
  end
end
if g[2] == 'k' then
  -- In a key-ordered group a re-driven delivery takes its place in its key's order: the
  -- head when it is the earliest (a later one already leased keeps its lease), else
  -- linked in after the last earlier one, parked until it is the head.
  local park = {}
  for _, sq in ipairs(members) do
    local k = seq_key(x, sq)
    local spec = k and redis.call('HGET', K, k)
    if k and not spec then
      redis.call('HSET', K, k, sq .. '|' .. sq)
    elseif spec then
      local head, tail = keyspec(spec)
      local n = tonumber(sq)
      if n < tonumber(head) then
        own_record(head)
        redis.call('HSET', N, sq, head)
        redis.call('HSET', K, k, sq .. '|' .. tail)
      else
        local prev = head
        local after = prev ~= tail and redis.call('HGET', N, prev)
        while after and tonumber(after) < n do
          prev = after
          after = prev ~= tail and redis.call('HGET', N, prev)
        end
        -- A later delivery rejected while an earlier one was redriven ahead of it is
        -- still linked in its place: it stays there (linking it again made it its own
        -- next one, and the key's later deliveries were lost).
        if after ~= sq then
          redis.call('HSET', N, prev, sq)
          if after then redis.call('HSET', N, sq, after) else tail = sq end
          redis.call('HSET', K, k, head .. '|' .. tail)
        end
        park[#park + 1] = S(PARK)
        park[#park + 1] = sq
      end
    end
  end
  if #park > 0 then bulk({'ZADD', Z}, park) end
end
if f > low - 1 then
  own_acks(D, B, low, f)
  redis.call('HSET', G, 'f', S(low - 1))
end
return #members
