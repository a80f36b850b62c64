-- work: a Redis Cluster's summary of which partitions of a stream's groups have work, in
--   a slot of its own ({P:s:work}; KeyLayout.work_keys). A hint the client keeps: the
--   partition scripts cannot write it (another slot), so the client notes work after an
--   append, nack, redrive, replay, reset or trim, and a fetch plans with it, visits the
--   partitions it names, and writes back what it found. A note bumps the stream's
--   version; a fetch's write only raises or clears a partition's entry when no note of
--   the partition came after its plan (a note it did not see wins), and lowers it always.
-- KEYS: the stream's version (v: INCR per note), appended (a: partition -> version of its
--   last append note), then the group's: state (g: s = the version up to which `a` is
--   folded into fresh, r = 1 once a fetch wrote every partition), fresh (set: the
--   partitions that may have events past the cursor), due (zset: partition -> no later
--   than when it may have a due delivery; 0: now), noted (nv: partition -> version of
--   its last group note). An append note passes only v and a.
-- ARGV: op, then
--   'a' (appended), partitions...: events were appended to them;
--   'n' (noted), '1' (fresh) or '0' (due now), partitions...: work of the group there;
--   'd' (due by), ms, partitions...: a renew moved leases there to expire at ms (it may be
--     earlier than the deadline the summary holds: a shorter lease_ms);
--   'p' (plan): fold `a` into fresh, then read the partitions with work;
--   'x' (exact), plan version, '1' when every partition is in it, then triples
--     partition, earliest due (0: none), fresh ('1' / '0'): what a fetch found.
-- Reply: 'a' / 'n' / 'd': the new version; 'x': 'OK'; 'p': {version, 1 when written from
--   every partition else 0, now (ms), fresh partitions 'p:score,...' (score '' when
--   none), due partitions 'p:score,...' (score at or before now)}.
local version_key, appended_key = KEYS[1], KEYS[2]
local state_key, fresh_key, due_key, noted_key = KEYS[3], KEYS[4], KEYS[5], KEYS[6]
local op = ARGV[1]
if op == 'a' then
  local version = redis.call('INCR', version_key)
  for at = 2, #ARGV do redis.call('ZADD', appended_key, version, ARGV[at]) end
  return version
end
if op == 'n' then
  local version = redis.call('INCR', version_key)
  for at = 3, #ARGV do
    if ARGV[2] == '1' then
      redis.call('SADD', fresh_key, ARGV[at])
    else
      redis.call('ZADD', due_key, 'LT', 0, ARGV[at])
    end
    redis.call('HSET', noted_key, ARGV[at], version)
  end
  return version
end
if op == 'd' then
  local version = redis.call('INCR', version_key)
  for at = 3, #ARGV do
    redis.call('ZADD', due_key, 'LT', ARGV[2], ARGV[at])
    redis.call('HSET', noted_key, ARGV[at], version)
  end
  return version
end
if op == 'x' then
  local planned = tonumber(ARGV[2])
  for at = 4, #ARGV, 3 do
    local partition, earliest, fresh = ARGV[at], ARGV[at + 1], ARGV[at + 2] == '1'
    if fresh then redis.call('SADD', fresh_key, partition) end
    if earliest ~= '0' then redis.call('ZADD', due_key, 'LT', earliest, partition) end
    local appended = tonumber(redis.call('ZSCORE', appended_key, partition) or '0')
    local noted = tonumber(redis.call('HGET', noted_key, partition) or '0')
    if appended <= planned and noted <= planned then
      if not fresh then redis.call('SREM', fresh_key, partition) end
      if earliest ~= '0' then
        redis.call('ZADD', due_key, earliest, partition)
      else
        redis.call('ZREM', due_key, partition)
      end
    end
  end
  if ARGV[3] == '1' then redis.call('HSET', state_key, 'r', '1') end
  return 'OK'
end
-- 'p': the plan.
local version = tonumber(redis.call('GET', version_key) or '0')
local folded_text, written = unpack(redis.call('HMGET', state_key, 's', 'r'))
local folded = tonumber(folded_text or '0')
if version > folded then
  local since = redis.call('ZRANGEBYSCORE', appended_key, '(' .. int_text(folded), '+inf')
  if #since > 0 then bulk({'SADD', fresh_key}, since) end
  redis.call('HSET', state_key, 's', int_text(version))
end
local now_text = int_text(now_ms())
local fresh = {}
for k, partition in ipairs(redis.call('SMEMBERS', fresh_key)) do
  fresh[k] = partition .. ':' .. (redis.call('ZSCORE', due_key, partition) or '')
end
local due = {}
local scored = redis.call('ZRANGEBYSCORE', due_key, '-inf', now_text, 'WITHSCORES')
for k = 1, #scored, 2 do due[#due + 1] = scored[k] .. ':' .. scored[k + 1] end
return {version, written and 1 or 0, tonumber(now_text), table.concat(fresh, ','),
        table.concat(due, ',')}
