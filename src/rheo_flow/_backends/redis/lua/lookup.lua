-- Prepended to settle and renew, after common.lua: the group partition's keys, the
-- records of the leases a batch names, and the check of each lease against its record.
local x, m, G, D, Z, R, B, Y = unpack(KEYS, 1, 8)
local BY = {a = 'K', n = 'N', r = 'J'}
BY['-'] = 'X'
-- The record of each leased sequence. A delivery without a record of its own that a
-- block covers is leased by the block lease (listed in `virt` with its lease id: not in
-- Z, nothing in D) past the frontier `f`, acked by it at or behind. Such a record is
-- found through the lease's own id: a batch may name another lease of the sequence
-- first (one of a block that no longer covers it), which finds none (false, as HMGET
-- answers) and must not hide the record the next one finds.
local function lookup(leases, f)
  local hw = tonumber(redis.call('HGET', m, 'hw') or '0')
  local fields = {}
  for k, l in ipairs(leases) do fields[k] = S(l[1]) end
  local cur = hmget(D, fields)
  local state, virt, blocks = {}, {}, {}
  for k, sq in ipairs(fields) do
    if not state[sq] then
      local r = cur[k]
      local lid = leases[k][3]
      if not r and type(lid) == 'string' then
        local pos = string.find(lid, ':', 1, true)
        if pos then
          local t = string.sub(lid, 1, pos - 1)
          local b = blocks[t]
          if b == nil then
            b = false
            local spec = redis.call('HGET', B, t)
            if spec then
              local first, last = blockspec(spec)
              b = {first, last}
            end
            blocks[t] = b
          end
          local n = leases[k][1]
          if b and n >= b[1] and n <= b[2] and lid == t .. ':' .. sq then
            if n <= f then
              r = 'K|1|' .. lid .. '|a||'
            else
              r = 'L|1|' .. lid .. '|||'
              virt[sq] = lid
            end
          end
        end
      end
      state[sq] = r
    end
  end
  return hw, fields, state, virt, blocks
end
-- The code of a lease that names nothing current, or nil with the parsed record.
local function check(l, r, hw)
  local seq = l[1]
  if not r then
    if seq >= 1 and seq <= hw then return 'P' end
    return 'Q'
  end
  local st, att, lid, by, _, _, err = parse(r)
  if lid ~= l[3] then return 'S' end
  if l[2] ~= eid(seq) then return 'M' end
  return nil, st, att, lid, by, err
end
-- Whether the consumer group's PEL holds an entry of the sequences a..b: only those need
-- an XACK. An unordered group's new deliveries never enter it (see fetch.lua); its
-- redeliveries, the deliveries of a key-ordered group and the leases of releases that
-- put every delivery there do.
local function pel_holds(a, b)
  return #redis.call('XPENDING', x, ARGV[1], eid(a), eid(b), 1) > 0
end
