-- group_lag: one group's total lag and dead letters, for tools outside rheo_flow (a metrics
--   exporter, an autoscaler's script hook) on a standalone Redis; a stable interface
--   (docs/backends.md, "Redis lag for external tools"), not run by the backend itself. It
--   names the keys itself (KeyLayout), so it cannot run on a Redis Cluster, where a
--   partition's keys live in a slot of their own: run the documented commands there.
-- KEYS: none.
-- ARGV: the key prefix ('rheo' unless configured), the stream, the group.
-- Reply: {'lag', the sum over the partitions of max(0, high water - frontier),
--   'dead_letters', the group's dead letters, 'partitions', the partition count}; an
--   error reply 'unknown stream or group' when either does not exist.
local prefix, stream, group = ARGV[1], ARGV[2], ARGV[3]
local record = redis.call('HGET', prefix .. ':streams', stream)
if not record or redis.call('HEXISTS', prefix .. ':groups:' .. stream, group) == 0 then
  return redis.error_reply('unknown stream or group')
end
local partition_count = tonumber(string.match(record, '^(%d+)'))
local lag, dead_letters = 0, 0
for partition = 0, partition_count - 1 do
  local tag = '{' .. prefix .. ':' .. stream .. ':' .. partition .. '}'
  local high_water = tonumber(redis.call('HGET', tag .. ':m', 'hw') or '0')
  local frontier = tonumber(redis.call('HGET', tag .. ':g:' .. group, 'f') or '0')
  if high_water > frontier then lag = lag + high_water - frontier end
  dead_letters = dead_letters + redis.call('ZCARD', tag .. ':g:' .. group .. ':r')
end
return {'lag', lag, 'dead_letters', dead_letters, 'partitions', partition_count}
