-- create_stream: the record of a stream, written by the first creator.
-- KEYS: streams_key (stream name -> record).
-- ARGV: name, partitions.
-- Reply: the stored record 'partitions|created_ms' (the first creator's).
local streams_key = KEYS[1]
local name, partitions = ARGV[1], ARGV[2]
local stored = redis.call('HGET', streams_key, name)
if stored then return stored end
stored = partitions .. '|' .. int_text(now_ms())
redis.call('HSET', streams_key, name, stored)
return stored
