-- KEYS: the group partition's x, m, G, D, Z, R, B, Y. ARGV: group, lease_ms,
-- JSON [[seq, receipt, lease_id, consumer]]. Returns "deadline:codes".
local group, lease_ms = ARGV[1], tonumber(ARGV[2])
local leases = cjson.decode(ARGV[3])
local now = now_ms()
local sdl = S(now + lease_ms)
local g = redis.call('HMGET', G, 'f')
if not g[1] then return sdl .. ':' .. string.rep('I', #leases) end
local hw, fields, state, virt = lookup(leases, tonumber(g[1]))
local codes, zadd, owners, hs = {}, {}, {}, {}
for k, l in ipairs(leases) do
  local sq = fields[k]
  local code, st, att, lid, by = check(l, state[sq], hw)
  if not code then
    if st ~= 'L' then
      code = BY[by] or 'X'
    else
      code = 'o'
      zadd[#zadd + 1] = sdl
      zadd[#zadd + 1] = sq
      if virt[sq] then
        -- Leaves its block: its own record and deadline from now on.
        virt[sq] = nil
        hs[#hs + 1] = sq
        hs[#hs + 1] = state[sq]
      end
      -- Reset the PEL idle time of our own leases (observability: XPENDING).
      local owner = tostring(l[4])
      if not owners[owner] then owners[owner] = {} end
      local ids = owners[owner]
      ids[#ids + 1] = sq .. '-0'
    end
  end
  codes[k] = code
end
if #zadd > 0 then
  if #hs > 0 then bulk({'HSET', D}, hs) end
  bulk({'ZADD', Z}, zadd)
  for owner, ids in pairs(owners) do
    bulk({'XCLAIM', x, group, owner, '0'}, ids)
  end
end
return sdl .. ':' .. table.concat(codes)
