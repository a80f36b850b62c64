-- KEYS: x, D, R. ARGV: after sequence, limit.
-- Returns JSON [[seq, attempts, rejected_at, reason, meta, last error or null], ...].
local stream_key, records_key, dead_key = KEYS[1], KEYS[2], KEYS[3]
local seqs = redis.call('ZRANGEBYSCORE', dead_key, '(' .. ARGV[1], '+inf', 'LIMIT', 0, tonumber(ARGV[2]))
if #seqs == 0 then return '[]' end
local records = hmget(records_key, seqs)
local out = {}
for k, seq_text in ipairs(seqs) do
  local record = records[k]
  if record then
    local state, attempt, lease_id, settled_by, at, reason, last_error = parse_record(record)
    local e = redis.call('XRANGE', stream_key, seq_text .. '-0', seq_text .. '-0')
    if state == 'R' and e[1] then
      out[#out + 1] = '[' .. seq_text .. ',' .. int_text(attempt) .. ',' .. at .. ',' .. cjson.encode(reason)
        .. ',' .. e[1][2][2] .. ',' .. (last_error and cjson.encode(last_error) or 'null') .. ']'
    end
  end
end
return '[' .. table.concat(out, ',') .. ']'
