-- set_retention: a stream's retention policy, kept in its record.
-- KEYS: streams_key (stream name -> record).
-- ARGV: name, max_age_ms, max_events (each '' when unset; both '' clears the policy).
-- Reply: 1, or 0 when the stream does not exist.
-- The record is 'partitions|created_ms' without a policy and
-- 'partitions|created_ms|max_age_ms|max_events' with one.
local streams_key = KEYS[1]
local name, age, events = ARGV[1], ARGV[2], ARGV[3]
local stored = redis.call('HGET', streams_key, name)
if not stored then return 0 end
local head = string.match(stored, '^([^|]*|[^|]*)')
if age == '' and events == '' then
  redis.call('HSET', streams_key, name, head)
else
  redis.call('HSET', streams_key, name, head .. '|' .. age .. '|' .. events)
end
return 1
