-- KEYS: the group partition's x, m, G, D, Z, R, B, Y, K, N. ARGV: group, position spec.
local stream_key, meta_key, group_key, records_key, due_key, dead_key, blocks_key, block_deadlines_key, key_spans_key, key_next_key = unpack(KEYS, 1, 10)
local group = ARGV[1]
if redis.call('EXISTS', group_key) == 0 then return 'NOGROUP' end
local meta = redis.call('HMGET', meta_key, 'hw', 'lw')
local pos = resolve_start(ARGV[2], tonumber(meta[1] or '0'), tonumber(meta[2] or '1'))
redis.call('DEL', records_key, due_key, dead_key, blocks_key, block_deadlines_key, key_spans_key, key_next_key)
-- Recreating the consumer group drops its pending entries and consumers.
redis.pcall('XGROUP', 'DESTROY', stream_key, group)
redis.call('XGROUP', 'CREATE', stream_key, group, entry_id(pos), 'MKSTREAM')
redis.call('HSET', group_key, 'f', int_text(pos), 'c', int_text(pos))
return 'OK'
