-- KEYS: the group partition's x, m, G, D, Z, R, B, Y, K, N. ARGV: group, op (a|n|r),
-- reason (then NUL and the error to record, if any), delay_ms,
-- JSON [[seq, receipt, lease_id, attempt, key], ...] (the key serves key-ordered groups:
-- a delivery settled for good releases its key when it is the key's head). Returns one
-- code letter per lease (see _settle.py), then '+' when releasing a key made its next
-- delivery due now. The attempt only serves the fast path: a
-- lease whose record is exactly 'L|attempt|lease_id|||' and whose receipt is its entry
-- id is current, with no parsing.
-- An ack may add the run form of the same leases: block token t, first, last: the
-- leases are exactly '<t>:<seq>' with receipt '<seq>-0' for every seq of first..last,
-- in order (the client checked those forms; the script checks the state and falls back
-- to the JSON when the run is not the frontier's next one).
local group, op, reason, delay = ARGV[1], ARGV[2], ARGV[3], tonumber(ARGV[4])
local given = nil
local cut = string.find(reason, '\0', 1, true)
if cut then
  given = string.sub(reason, cut + 1)
  reason = string.sub(reason, 1, cut - 1)
end
local K, N = KEYS[9], KEYS[10]
-- Deliveries of keys ks[i] (not a string: keyless) and sequences sqs[i] (text) are settled
-- for good: each releases its key when it is the key's head. The state of the keys is
-- read at once; a key settled twice in the batch (its later settles then see what the
-- first did) is released one delivery at a time. Returns '+' when that made a delivery
-- due now (the client wakes its idle fetchers of the stream), else ''.
local function release_all(ks, sqs, snow)
  local keys, firsts, later, free = {}, {}, {}, {}
  for i = 1, #sqs do
    local key = ks[i]
    if type(key) == 'string' then
      if firsts[key] then
        later[#later + 1] = i
      else
        firsts[key] = i
        keys[#keys + 1] = key
      end
    end
  end
  if #keys == 0 then return '' end
  local due = false
  for i, spec in ipairs(hmget(K, keys)) do
    local key = keys[i]
    local sq = sqs[firsts[key]]
    if spec == sq .. '|' .. sq then
      free[#free + 1] = key
    elseif spec then
      local head, tail = keyspec(spec)
      if head == sq and pass_key(K, N, D, Z, key, head, tail, 0, snow) then due = true end
    end
  end
  if #free > 0 then bulk({'HDEL', K}, free) end
  for _, i in ipairs(later) do
    if release(K, N, D, Z, ks[i], sqs[i], snow) then due = true end
  end
  if due then return '+' end
  return ''
end
local g = redis.call('HMGET', G, 'f', 'ma', 'o')
local keyed = g[3] == 'k'
if g[1] and ARGV[6] and op == 'a' then
  -- The run form (see above): every lease of the run is current exactly when its block
  -- covers it, the frontier is right before it and none of its deliveries has a
  -- record of its own. Then the ack moves the frontier over it and writes no record
  -- (in a key-ordered group each keyed delivery of the run is its key's head: released).
  local f = tonumber(g[1])
  local first, last = tonumber(ARGV[7]), tonumber(ARGV[8])
  local spec = first == f + 1 and redis.call('HGET', B, ARGV[6])
  if spec then
    local bf, bl = blockspec(spec)
    local own = false
    if first >= bf and last <= bl and redis.call('HLEN', D) > 0 then
      for _, r in ipairs(hmget(D, seq_fields(first, last))) do
        if r then own = true break end
      end
    end
    if first >= bf and last <= bl and not own then
      if pel_holds(first, last) then
        local ids = {}
        for n = first, last do ids[#ids + 1] = eid(n) end
        bulk({'XACK', x, group}, ids)
      end
      local nf = advance(D, last)
      redis.call('HSET', G, 'f', S(nf))
      -- A block wholly behind the frontier has nothing left to expire.
      if bl <= nf then redis.call('ZREM', Y, ARGV[6]) end
      if keyed then
        local ks, sqs = {}, {}
        for i, l in ipairs(cjson.decode(ARGV[5])) do
          ks[i] = l[5]
          sqs[i] = S(l[1])
        end
        return string.rep('o', last - first + 1) .. release_all(ks, sqs, S(now_ms()))
      end
      return string.rep('o', last - first + 1)
    end
  end
end
local leases = cjson.decode(ARGV[5])
if not g[1] then return string.rep('I', #leases) end
local f, ma = tonumber(g[1]), tonumber(g[2])
local now = now_ms()
local snow = S(now)
local hw, fields, state, virt, blocks = lookup(leases, f)
local codes, dirty, zrem, zadd, radd, acks, vacks = {}, {}, {}, {}, {}, {}, {}
-- The lowest and highest sequence in acks.
local lo, hi = nil, nil
-- The keys and sequences of the deliveries settled for good (key-ordered groups).
local fkeys, fseqs = {}, {}
local front = false
for k, l in ipairs(leases) do
  local sq = fields[k]
  local cur = state[sq]
  local code, st, att, lid, by, err
  local a = l[4]
  if virt[sq] == l[3] and l[2] == sq .. '-0' then
    st, att, lid = 'L', 1, l[3]
  elseif cur and type(a) == 'number' and a % 1 == 0 and type(l[3]) == 'string'
      and cur == 'L|' .. S(a) .. '|' .. l[3] .. '|||' and l[2] == sq .. '-0' then
    st, att, lid = 'L', a, l[3]
  else
    code, st, att, lid, by, err = check(l, cur, hw)
  end
  if given then err = given end
  if not code then
    if st ~= 'L' then
      if by == op then code = 'r' else code = BY[by] or 'X' end
    else
      code = 'o'
      local r
      local terminal = true
      if op == 'a' then
        r = 'K|' .. S(att) .. '|' .. lid .. '|a||'
      elseif op == 'r' then
        r = rec('R', att, lid, 'r', snow, reason, err)
      elseif att >= ma then
        r = rec('R', att, lid, 'n', snow, 'max_attempts', err)
      else
        r = rec('A', att, lid, 'n', '', '', err)
        terminal = false
        zadd[#zadd + 1] = S(now + delay)
        zadd[#zadd + 1] = sq
      end
      if terminal then
        if not virt[sq] then zrem[#zrem + 1] = sq end
        acks[#acks + 1] = sq .. '-0'
        if not lo or l[1] < lo then lo = l[1] end
        if not hi or l[1] > hi then hi = l[1] end
        if op ~= 'a' then
          radd[#radd + 1] = sq
          radd[#radd + 1] = sq
        end
        if l[1] == f + 1 then front = true end
        if keyed then
          local i = #fseqs + 1
          fkeys[i] = l[5]
          fseqs[i] = sq
        end
      end
      state[sq] = r
      if virt[sq] and op == 'a' then
        -- Written below only if the frontier does not pass it.
        vacks[#vacks + 1] = l
      else
        dirty[#dirty + 1] = sq
        dirty[#dirty + 1] = r
      end
      virt[sq] = nil
    end
  end
  codes[k] = code
end
local nf = f
if front then
  -- This batch's records first (D may hold older ones for them), then D's.
  while true do
    local r = state[S(nf + 1)]
    if r then
      local b = string.byte(r, 1)
      if b ~= 75 and b ~= 82 then break end
      nf = nf + 1
    else
      local before = nf
      nf = advance(D, nf)
      if nf == before then break end
    end
  end
end
for _, l in ipairs(vacks) do
  if l[1] > nf then
    local sq = S(l[1])
    dirty[#dirty + 1] = sq
    dirty[#dirty + 1] = state[sq]
  end
end
if #dirty > 0 then bulk({'HSET', D}, dirty) end
if #zrem > 0 then bulk({'ZREM', Z}, zrem) end
if #zadd > 0 then bulk({'ZADD', Z}, zadd) end
if #radd > 0 then bulk({'ZADD', R}, radd) end
if #acks > 0 and pel_holds(lo, hi) then bulk({'XACK', x, group}, acks) end
-- After the records: releasing a key reads the records of its later deliveries.
local woke = ''
if #fseqs > 0 then woke = release_all(fkeys, fseqs, snow) end
if nf > f then
  redis.call('HSET', G, 'f', S(nf))
  -- A block wholly behind the frontier has nothing left to expire.
  local done = {}
  for t, b in pairs(blocks) do
    if b and b[2] <= nf then done[#done + 1] = t end
  end
  if #done > 0 then bulk({'ZREM', Y}, done) end
end
return table.concat(codes) .. woke
