-- dead_letters: list the dead letters of one group partition.
-- KEYS: stream_key (x), records_key (:d), dead_key (:r) of the group partition.
-- ARGV: after (list the sequences past it), limit.
-- Reply: JSON [[seq, attempts, rejected_at, reason, meta, last error or null], ...].
local stream_key, records_key, dead_key = KEYS[1], KEYS[2], KEYS[3]
local after, limit = ARGV[1], tonumber(ARGV[2])
local seq_texts = redis.call('ZRANGEBYSCORE', dead_key, '(' .. after, '+inf', 'LIMIT', 0, limit)
if #seq_texts == 0 then return '[]' end
local records = hmget(records_key, seq_texts)
local out = {}
for k, seq_text in ipairs(seq_texts) do
  local record = records[k]
  if record then
    local state, attempt, _, _, rejected_at, reason, last_error = parse_record(record)
    local entry = redis.call('XRANGE', stream_key, seq_text .. '-0', seq_text .. '-0')
    if state == REJECTED and entry[1] then
      out[#out + 1] = '[' .. seq_text .. ',' .. int_text(attempt) .. ',' .. rejected_at .. ','
        .. cjson.encode(reason) .. ',' .. entry[1][2][ENTRY_META] .. ','
        .. (last_error and cjson.encode(last_error) or 'null') .. ']'
    end
  end
end
return '[' .. table.concat(out, ',') .. ']'
