-- lag_partition: the helper of lag and lag_many (prepended to them after common.lua):
--   what every group of one partition has left to consume.
-- KEYS: none of its own (its callers name the keys).
-- ARGV: none of its own.
-- Reply: none; partition_lag appends to `out`: the high water (-1 when the partition is
--   gone: its stream deleted), then per group its frontier (-1 when the group is gone),
--   dead letters, oldest (the append time of the first stored event past the frontier;
--   -1: none) and scheduled (the events past the frontier whose deliver_at is after
--   now): 1 + 4 values per group, always.
local function partition_lag(stream_key, meta_key, times_key, group_keys_list, now, out)
  local high_water_text, marker = unpack(redis.call('HMGET', meta_key, 'hw', 'mk'))
  local at = #out
  if not marker then
    out[at + 1] = -1
    for k = 1, #group_keys_list do
      out[at + 4 * k - 2], out[at + 4 * k - 1], out[at + 4 * k], out[at + 4 * k + 1] = -1, 0, -1, 0
    end
    return
  end
  local high_water = tonumber(high_water_text or '0')
  local later_seqs = {}
  for k, seq_text in ipairs(redis.call('ZRANGEBYSCORE', times_key, '(' .. now, '+inf')) do
    later_seqs[k] = tonumber(seq_text)
  end
  out[at + 1] = high_water
  for k, pair in ipairs(group_keys_list) do
    local group_key, dead_key = pair[1], pair[2]
    local frontier_text = redis.call('HGET', group_key, 'f')
    local base = at + 4 * k - 2
    if not frontier_text then
      out[base], out[base + 1], out[base + 2], out[base + 3] = -1, 0, -1, 0
    else
      local frontier = tonumber(frontier_text)
      local oldest = -1
      if high_water > frontier then
        local entries = redis.call('XRANGE', stream_key, entry_id(frontier + 1), '+', 'COUNT', 1)
        if entries[1] then oldest = tonumber(entries[1][2][ENTRY_TIME]) end
      end
      local scheduled = 0
      for _, seq in ipairs(later_seqs) do
        if seq > frontier then scheduled = scheduled + 1 end
      end
      out[base] = frontier
      out[base + 1] = redis.call('ZCARD', dead_key)
      out[base + 2] = oldest
      out[base + 3] = scheduled
    end
  end
end
