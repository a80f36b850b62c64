-- lag: what every group of some partitions has left to consume (Backend.lag_report; read
--   only). It names the keys it reads itself from the partitions' tag heads, as
--   KeyLayout.group does: on standalone Redis one call reads partitions of several
--   streams; on a Redis Cluster one call reads one partition, and its one key routes it
--   to the partition's slot (every key it names carries that slot's hash tag).
-- KEYS: none on standalone Redis; on a Redis Cluster the stream key (x) of the partition.
-- ARGV: now (ms since the epoch, the report's reading of the server clock), then per
--   stream: its tag head ('{P:s:'), first partition, end partition (excluded), group
--   count, the group names.
-- Reply: per stream, per partition from first to end in order: the high water (-1 when
--   the partition is gone: its stream deleted), then per group its frontier (-1 when the
--   group is gone), dead letters, oldest (the append time of the first stored event past
--   the frontier; -1: none) and scheduled (the events past the frontier whose
--   deliver_at is after now): 1 + 4 values per group, always.
-- Appends one partition's values to `out` (see Reply); `tag`: its hash tag '{P:s:p}'.
local function partition_lag(tag, groups, now, out)
  local stream_key = tag .. ':x'
  local high_water_text, marker = unpack(redis.call('HMGET', tag .. ':m', 'hw', 'mk'))
  local at = #out
  if not marker then
    out[at + 1] = -1
    for k = 1, #groups do
      out[at + 4 * k - 2], out[at + 4 * k - 1], out[at + 4 * k], out[at + 4 * k + 1] = -1, 0, -1, 0
    end
    return
  end
  local high_water = tonumber(high_water_text or '0')
  local later_seqs = {}
  for k, seq_text in ipairs(redis.call('ZRANGEBYSCORE', tag .. ':t', '(' .. now, '+inf')) do
    later_seqs[k] = tonumber(seq_text)
  end
  out[at + 1] = high_water
  -- Frontier -> the append time of the first event past it: groups at one frontier read it once.
  local oldest_at = {}
  for k, group in ipairs(groups) do
    local group_key = tag .. ':g:' .. group
    local frontier_text = redis.call('HGET', group_key, 'f')
    local base = at + 4 * k - 2
    if not frontier_text then
      out[base], out[base + 1], out[base + 2], out[base + 3] = -1, 0, -1, 0
    else
      local frontier = tonumber(frontier_text)
      local oldest = -1
      if high_water > frontier then
        oldest = oldest_at[frontier]
        if not oldest then
          local entries = redis.call('XRANGE', stream_key, entry_id(frontier + 1), '+', 'COUNT', 1)
          oldest = entries[1] and tonumber(entries[1][2][ENTRY_TIME]) or -1
          oldest_at[frontier] = oldest
        end
      end
      local scheduled = 0
      for _, seq in ipairs(later_seqs) do
        if seq > frontier then scheduled = scheduled + 1 end
      end
      out[base] = frontier
      out[base + 1] = redis.call('ZCARD', group_key .. ':r')
      out[base + 2] = oldest
      out[base + 3] = scheduled
    end
  end
end
local now = ARGV[1]
local out = {}
local arg_at = 2
while arg_at <= #ARGV do
  local tag_head = ARGV[arg_at]
  local first, stop = tonumber(ARGV[arg_at + 1]), tonumber(ARGV[arg_at + 2])
  local group_count = tonumber(ARGV[arg_at + 3])
  local groups = {}
  for k = 1, group_count do groups[k] = ARGV[arg_at + 3 + k] end
  arg_at = arg_at + 4 + group_count
  for partition = first, stop - 1 do
    partition_lag(tag_head .. int_text(partition) .. '}', groups, now, out)
  end
end
return out
