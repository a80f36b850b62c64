-- KEYS: groups hash of a stream. ARGV: group, max_attempts ('' keeps), default, start,
-- ordering (key|none). Returns "max_attempts|created_ms|start", then "|key" for a
-- key-ordered group (records written before key ordering have no fourth field). An
-- existing group without key ordering asked for it is returned unchanged (refused).
local stored = redis.call('HGET', KEYS[1], ARGV[1])
if stored then
  local refused = ARGV[5] == 'key' and not string.find(stored, '|key$')
  if ARGV[2] ~= '' and not refused then
    local max_attempts, created, start = string.match(stored, '^(%d+)|(%d+)|(.*)$')
    if max_attempts ~= ARGV[2] then
      stored = ARGV[2] .. '|' .. created .. '|' .. start
      redis.call('HSET', KEYS[1], ARGV[1], stored)
    end
  end
  return stored
end
local max_attempts = ARGV[2]
if max_attempts == '' then max_attempts = ARGV[3] end
stored = max_attempts .. '|' .. int_text(now_ms()) .. '|' .. ARGV[4]
if ARGV[5] == 'key' then stored = stored .. '|key' end
redis.call('HSET', KEYS[1], ARGV[1], stored)
return stored
