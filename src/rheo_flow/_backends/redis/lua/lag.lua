-- lag: what every group of one partition has left to consume (Backend.lag_report; read only).
-- KEYS: the partition's stream_key (x), meta_key (m) and times_key (t: scheduled seqs by
--   deliver_at), then per group its group_key (G) and dead_key (:r).
-- ARGV: now (ms since the epoch, the report's reading of the server clock).
-- Reply: {high water, then per group: frontier, dead letters, oldest, scheduled}: -1 alone
--   when the partition is gone (its stream deleted); a frontier of -1 when the group is
--   gone; oldest is the append time of the first stored event past the frontier (-1:
--   none); scheduled counts the events past the frontier whose deliver_at is after now.
local stream_key, meta_key, times_key = KEYS[1], KEYS[2], KEYS[3]
local now = ARGV[1]
local high_water_text, marker = unpack(redis.call('HMGET', meta_key, 'hw', 'mk'))
if not marker then return {-1} end
local high_water = tonumber(high_water_text or '0')
local later = redis.call('ZRANGEBYSCORE', times_key, '(' .. now, '+inf')
local later_seqs = {}
for k, seq_text in ipairs(later) do later_seqs[k] = tonumber(seq_text) end
local out = {high_water}
for key_at = 4, #KEYS, 2 do
  local frontier_text = redis.call('HGET', KEYS[key_at], 'f')
  local at = #out
  if not frontier_text then
    out[at + 1], out[at + 2], out[at + 3], out[at + 4] = -1, 0, -1, 0
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
    out[at + 1] = frontier
    out[at + 2] = redis.call('ZCARD', KEYS[key_at + 1])
    out[at + 3] = oldest
    out[at + 4] = scheduled
  end
end
return out
