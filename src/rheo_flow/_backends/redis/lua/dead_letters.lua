-- KEYS: x, D, R. ARGV: after sequence, limit.
-- Returns JSON [[seq, attempts, rejected_at, reason, meta, last error or null], ...].
local x, D, R = KEYS[1], KEYS[2], KEYS[3]
local seqs = redis.call('ZRANGEBYSCORE', R, '(' .. ARGV[1], '+inf', 'LIMIT', 0, tonumber(ARGV[2]))
if #seqs == 0 then return '[]' end
local recs = hmget(D, seqs)
local out = {}
for k, sq in ipairs(seqs) do
  local r = recs[k]
  if r then
    local st, att, lid, by, at, reason, err = parse(r)
    local e = redis.call('XRANGE', x, sq .. '-0', sq .. '-0')
    if st == 'R' and e[1] then
      out[#out + 1] = '[' .. sq .. ',' .. S(att) .. ',' .. at .. ',' .. cjson.encode(reason)
        .. ',' .. e[1][2][2] .. ',' .. (err and cjson.encode(err) or 'null') .. ']'
    end
  end
end
return '[' .. table.concat(out, ',') .. ']'
