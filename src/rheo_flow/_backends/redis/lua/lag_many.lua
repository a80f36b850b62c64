-- lag_many: what every group of every partition of some streams has left to consume
--   (Backend.lag_report on standalone Redis; read only). It reads keys of many partitions,
--   which it names itself from their tag heads, as KeyLayout.group does.
-- KEYS: none.
-- ARGV: now (ms since the epoch, the report's reading of the server clock), then per
--   stream: its tag head ('{P:s:'), partition count, group count, the group names.
-- Reply: per stream, per partition in order, partition_lag's values (lag_partition.lua):
--   the high water, then 4 per group.
local now = ARGV[1]
local out = {}
local arg_at = 2
while arg_at <= #ARGV do
  local tag_head = ARGV[arg_at]
  local partition_count, group_count = tonumber(ARGV[arg_at + 1]), tonumber(ARGV[arg_at + 2])
  local groups = {}
  for k = 1, group_count do groups[k] = ARGV[arg_at + 2 + k] end
  arg_at = arg_at + 3 + group_count
  for partition = 0, partition_count - 1 do
    local tag = tag_head .. int_text(partition) .. '}'
    local group_keys_list = {}
    for k, group in ipairs(groups) do
      group_keys_list[k] = {tag .. ':g:' .. group, tag .. ':g:' .. group .. ':r'}
    end
    partition_lag(tag .. ':x', tag .. ':m', tag .. ':t', group_keys_list, now, out)
  end
end
return out
