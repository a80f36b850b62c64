-- KEYS: groups hash of a stream. ARGV: group, max_attempts ('' keeps), default, start,
-- ordering (key|none). Returns "max_attempts|created_ms|start", then "|key" for a
-- key-ordered group (records written before key ordering have no fourth field). An
-- existing group without key ordering asked for it is returned unchanged (refused).
local cur = redis.call('HGET', KEYS[1], ARGV[1])
if cur then
  local refused = ARGV[5] == 'key' and not string.find(cur, '|key$')
  if ARGV[2] ~= '' and not refused then
    local ma, created, start = string.match(cur, '^(%d+)|(%d+)|(.*)$')
    if ma ~= ARGV[2] then
      cur = ARGV[2] .. '|' .. created .. '|' .. start
      redis.call('HSET', KEYS[1], ARGV[1], cur)
    end
  end
  return cur
end
local ma = ARGV[2]
if ma == '' then ma = ARGV[3] end
cur = ma .. '|' .. S(now_ms()) .. '|' .. ARGV[4]
if ARGV[5] == 'key' then cur = cur .. '|key' end
redis.call('HSET', KEYS[1], ARGV[1], cur)
return cur
