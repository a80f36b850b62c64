-- group_record: the record of a group, written by the first creator.
-- KEYS: groups_key (the stream's group name -> record).
-- ARGV: group, max_attempts ('' keeps the stored one), default max_attempts, start,
--   ordering ('key' or 'none').
-- Reply: the stored record 'max_attempts|created_ms|start', then '|key' for a key-ordered
--   group (records written before key ordering have no fourth field). An existing group
--   without key ordering asked for it is returned unchanged (refused).
local groups_key = KEYS[1]
local group, max_attempts, default_max_attempts, start, ordering =
  ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5]
local KEY_ORDERED = 'key'
local stored = redis.call('HGET', groups_key, group)
if stored then
  local refused = ordering == KEY_ORDERED and not string.find(stored, '|key$')
  if max_attempts ~= '' and not refused then
    local stored_max_attempts, created, stored_start = string.match(stored, '^(%d+)|(%d+)|(.*)$')
    if stored_max_attempts ~= max_attempts then
      stored = max_attempts .. '|' .. created .. '|' .. stored_start
      redis.call('HSET', groups_key, group, stored)
    end
  end
  return stored
end
if max_attempts == '' then max_attempts = default_max_attempts end
stored = max_attempts .. '|' .. int_text(now_ms()) .. '|' .. start
if ordering == KEY_ORDERED then stored = stored .. '|' .. KEY_ORDERED end
redis.call('HSET', groups_key, group, stored)
return stored
