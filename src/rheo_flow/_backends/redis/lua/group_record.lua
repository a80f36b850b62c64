-- KEYS: groups hash of a stream. ARGV: group, max_attempts ('' keeps), default, start.
-- Returns "max_attempts|created_ms|start".
local cur = redis.call('HGET', KEYS[1], ARGV[1])
if cur then
  if ARGV[2] ~= '' then
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
redis.call('HSET', KEYS[1], ARGV[1], cur)
return cur
