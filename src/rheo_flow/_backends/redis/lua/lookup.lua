-- Prepended to settle and renew, after common.lua: the group partition's keys, the
-- records of the leases a batch names, and the check of each lease against its record.
local stream_key, meta_key, group_key, records_key, due_key, dead_key, blocks_key, block_deadlines_key = unpack(KEYS, 1, 8)
local BY = {a = 'K', n = 'N', record = 'J'}
BY['-'] = 'X'
-- The record of each leased sequence. A delivery without a record of its own that a
-- block covers is leased by the block lease (listed in `virt` with its lease id: not in
-- Z, nothing in D) past the frontier `f`, acked by it at or behind. Such a record is
-- found through the lease's own id: a batch may name another lease of the sequence
-- first (one of a block that no longer covers it), which finds none (false, as HMGET
-- answers) and must not hide the record the next one finds.
local function lookup(leases, frontier)
  local high_water = tonumber(redis.call('HGET', meta_key, 'hw') or '0')
  local fields = {}
  for k, lease in ipairs(leases) do fields[k] = int_text(lease[1]) end
  local stored = hmget(records_key, fields)
  local record_of, block_lease_of, blocks = {}, {}, {}
  for k, seq_text in ipairs(fields) do
    if not record_of[seq_text] then
      local record = stored[k]
      local lease_id = leases[k][3]
      if not record and type(lease_id) == 'string' then
        local pos = string.find(lease_id, ':', 1, true)
        if pos then
          local token = string.sub(lease_id, 1, pos - 1)
          local b = blocks[token]
          if b == nil then
            b = false
            local spec = redis.call('HGET', blocks_key, token)
            if spec then
              local first, last = parse_block(spec)
              b = {first, last}
            end
            blocks[token] = b
          end
          local n = leases[k][1]
          if b and n >= b[1] and n <= b[2] and lease_id == token .. ':' .. seq_text then
            if n <= frontier then
              record = 'K|1|' .. lease_id .. '|a||'
            else
              record = 'L|1|' .. lease_id .. '|||'
              block_lease_of[seq_text] = lease_id
            end
          end
        end
      end
      record_of[seq_text] = record
    end
  end
  return high_water, fields, record_of, block_lease_of, blocks
end
-- The code of a lease that names nothing current, or nil with the parsed record.
local function check(lease, record, high_water)
  local seq = lease[1]
  if not record then
    if seq >= 1 and seq <= high_water then return 'P' end
    return 'Q'
  end
  local state, attempt, lease_id, settled_by, _, _, last_error = parse_record(record)
  if lease_id ~= lease[3] then return 'S' end
  if lease[2] ~= entry_id(seq) then return 'M' end
  return nil, state, attempt, lease_id, settled_by, last_error
end
-- Whether the consumer group's PEL holds an entry of the sequences a..b: only those need
-- an XACK. An unordered group's new deliveries never enter it (see fetch.lua); its
-- redeliveries, the deliveries of a key-ordered group and the leases of releases that
-- put every delivery there do.
local function pel_holds(a, b)
  return #redis.call('XPENDING', stream_key, ARGV[1], entry_id(a), entry_id(b), 1) > 0
end
