-- reset: start a group partition over at a position, forgetting every delivery.
-- KEYS: the group partition's keys (group_keys in common.lua), then on standalone Redis
--   the group's summaries (summary_keys, from KEYS[11]).
-- ARGV: group, position spec ('earliest', 'latest' or a sequence).
-- Reply: 'OK', or 'NOGROUP'.
local keys = group_keys(1, 3)
keys.summary = summary_keys(11)
local group, spec = ARGV[1], ARGV[2]
if redis.call('EXISTS', keys.group) == 0 then return 'NOGROUP' end
local high_water_text, low_water_text = unpack(redis.call('HMGET', keys.meta, 'hw', 'lw'))
local pos = resolve_start(spec, tonumber(high_water_text or '0'), tonumber(low_water_text or '1'))
redis.call('DEL', keys.records, keys.due, keys.dead, keys.blocks, keys.block_deadlines,
           keys.key_spans, keys.key_next)
-- Recreating the consumer group drops its pending entries and consumers.
redis.pcall('XGROUP', 'DESTROY', keys.stream, group)
redis.call('XGROUP', 'CREATE', keys.stream, group, entry_id(pos), 'MKSTREAM')
redis.call('HSET', keys.group, 'f', int_text(pos), 'c', int_text(pos))
note_fresh(keys)
return 'OK'
