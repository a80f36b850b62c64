-- fetch_many: lease up to `limit` deliveries of one group from the partitions of a stream
--   that have work, in one call (standalone Redis only: it reads keys of many partitions,
--   which it names itself from the tag head, as KeyLayout.group does).
-- KEYS: the group's summaries (summary_keys): due, fresh.
-- ARGV: tag head ('{P:s:'), group, consumer, limit, lease_ms, token, partition count,
--   the partitions asked for (comma-separated, in this fetch's order; '' for all, from
--   `start` on), start, the partitions whose new deliveries the client reads itself
--   (comma-separated: their ranges come back unread, as fetch.lua's), then '1' to first
--   write the summaries of every partition from the partitions themselves (what data
--   written without them needs: a release before them, or a rolling upgrade), then the
--   partitions whose high water the client asks for (comma-separated: those its wake-ups
--   know none of).
-- Reply: 'LOST' / 'NOGROUP' (of the first partition asked for) when nothing was visited
--   and that partition's marker or group is gone; else an array: the high waters asked
--   for ('p=hw,...'), then (partition, block token, fetch.lua's reply for that block) for
--   each call of fetch_partition it made, in the order made (none when no partition has
--   work).
-- The partitions with work are those of the `fresh` summary and those whose due
-- summary has come. The limit is shared evenly among them in the fetch's
-- order; what a partition cannot fill goes to those that filled their share, one at a
-- time to the lowest first (as the turns of fetch.fair take them), until the limit is
-- reached or every partition visited ran out.
local summary = summary_keys(1)
local tag_head, group, consumer = ARGV[1], ARGV[2], ARGV[3]
local limit, lease_ms, token = tonumber(ARGV[4]), tonumber(ARGV[5]), ARGV[6]
local partition_count, asked, start = tonumber(ARGV[7]), ARGV[8], tonumber(ARGV[9])
-- Partition (text) -> its place in this fetch's order (0 first); nil: not asked for.
local place_of_asked = {}
local place
if asked == '' then
  place = function(partition)
    local number = tonumber(partition)
    if number >= partition_count then return nil end
    return (number - start) % partition_count
  end
else
  local at = 0
  for partition in string.gmatch(asked, '%d+') do
    place_of_asked[partition] = at
    at = at + 1
  end
  place = function(partition) return place_of_asked[partition] end
end
local client_reads = {}
for partition in string.gmatch(ARGV[10], '%d+') do client_reads[partition] = true end
local function partition_keys(partition)
  local tag = tag_head .. partition .. '}'
  local base = tag .. ':g:' .. group
  return {
    stream = tag .. ':x', meta = tag .. ':m', group = base, records = base .. ':d',
    due = base .. ':z', dead = base .. ':r', blocks = base .. ':b',
    block_deadlines = base .. ':y', key_spans = base .. ':k', key_next = base .. ':n',
    summary = summary,
  }
end
if ARGV[11] == '1' then
  for partition = 0, partition_count - 1 do
    local keys = partition_keys(int_text(partition))
    local high_water_text = redis.call('HGET', keys.meta, 'hw')
    local cursor_text = redis.call('HGET', keys.group, 'c')
    if cursor_text then
      summarize(keys, tonumber(high_water_text or '0'), tonumber(cursor_text), nil)
    end
  end
end
-- The partitions with work: the `fresh` ones, then those whose due summary has come.
local with_work, fresh = {}, {}
for _, partition in ipairs(redis.call('SMEMBERS', summary.fresh)) do
  fresh[partition] = true
  if place(partition) then with_work[partition] = true end
end
local now_text = int_text(now_ms())
for _, partition in ipairs(redis.call('ZRANGEBYSCORE', summary.due, '-inf', now_text)) do
  if place(partition) then with_work[partition] = true end
end
-- The partitions with work, in this fetch's order.
local open, place_in = {}, {}
for partition in pairs(with_work) do
  open[#open + 1] = partition
  place_in[partition] = place(partition)
end
table.sort(open, function(a, b) return place_in[a] < place_in[b] end)
if #open == 0 then
  -- Nothing visited checked the stream and the group: the first partition asked for does.
  local first = asked == '' and int_text(start) or string.match(asked, '%d+')
  local keys = partition_keys(first)
  if not redis.call('HGET', keys.meta, 'mk') then return 'LOST' end
  if redis.call('EXISTS', keys.group) == 0 then return 'NOGROUP' end
end
-- The high waters asked for, read before any lease: an append after this call must still
-- wake the client's wait.
local high_waters = {}
for partition in string.gmatch(ARGV[12], '%d+') do
  local tag = tag_head .. partition .. '}'
  high_waters[#high_waters + 1] = partition .. '=' .. (redis.call('HGET', tag .. ':m', 'hw') or '0')
end
-- The shares of `total` over the open partitions that already got `got`: one at a time
-- to the lowest first, in this fetch's order on a tie.
local got = {}
for _, partition in ipairs(open) do got[partition] = 0 end
local function level_shares(total)
  local sorted = {}
  for k, partition in ipairs(open) do sorted[k] = partition end
  table.sort(sorted, function(a, b)
    if got[a] ~= got[b] then return got[a] < got[b] end
    return place_in[a] < place_in[b]
  end)
  local share = {}
  for _, partition in ipairs(sorted) do share[partition] = 0 end
  local level, lowest = got[sorted[1]], 1
  while total > 0 do
    while lowest < #sorted and got[sorted[lowest + 1]] <= level do lowest = lowest + 1 end
    local next_level = lowest < #sorted and got[sorted[lowest + 1]] or math.huge
    local room = (next_level - level) * lowest
    if room <= total then
      for k = 1, lowest do share[sorted[k]] = share[sorted[k]] + next_level - level end
      total = total - room
      level = next_level
    else
      local each, extra = math.floor(total / lowest), total % lowest
      local tied = {}
      for k = 1, lowest do tied[k] = sorted[k] end
      table.sort(tied, function(a, b) return place_in[a] < place_in[b] end)
      for k, partition in ipairs(tied) do
        share[partition] = share[partition] + each + (k <= extra and 1 or 0)
      end
      total = 0
    end
  end
  return share
end
local reply = {table.concat(high_waters, ',')}
local remaining = limit
local round = 0
while remaining > 0 and #open > 0 do
  local share = level_shares(remaining)
  local still_open = {}
  for _, partition in ipairs(open) do
    local quota = share[partition]
    if quota == 0 then
      still_open[#still_open + 1] = partition
    else
      local block_token = token .. '.' .. partition
      if round > 0 then block_token = block_token .. '.' .. round end
      local answer = fetch_partition(partition_keys(partition), group, consumer, quota,
        lease_ms, block_token .. '.', block_token, not client_reads[partition],
        fresh[partition] or false)
      if type(answer) ~= 'table' then
        if answer ~= 'AGAIN' then return answer end
      else
        reply[#reply + 1] = partition
        reply[#reply + 1] = block_token
        reply[#reply + 1] = answer
        got[partition] = got[partition] + answer.leased
        remaining = remaining - answer.leased
        -- A partition that filled its share may have more; one that did not has none
        -- (or a key-ordered scan stopped at its budget: the client reads on).
        if answer.leased == quota and answer.more == 0 then
          still_open[#still_open + 1] = partition
        end
      end
    end
  end
  open = still_open
  round = round + 1
end
return reply
