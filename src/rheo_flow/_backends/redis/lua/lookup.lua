-- Prepended to settle and renew, after common.lua: the group partition's keys, the reply
-- codes, the records of the leases a batch names, and the check of each lease against its
-- record.
local keys = group_keys(1, 3)
-- The group's summaries (standalone Redis: KEYS 11 to 13; see summary_keys).
keys.summary = summary_keys(11)
-- The fields of a lease row of ARGV (JSON [seq, receipt, lease_id, ...]).
local SEQ, RECEIPT, LEASE_ID = 1, 2, 3
-- The code letters of the reply, one per lease (_settle.py reads them).
local OK, REPEATED = 'o', 'r'
local LEASED_AGAIN, RECEIPT_MISMATCH, NO_GROUP, NO_DELIVERY, GONE = 'S', 'M', 'I', 'Q', 'P'
-- The code of a lease whose delivery was settled already, by who settled it.
local SETTLED_BY = {[BY_ACK] = 'K', [BY_NACK] = 'N', [BY_REJECT] = 'J', [BY_EXPIRY] = 'X'}
-- What `blocks` holds for a token that names no block.
local NO_BLOCK = false
-- The record of each leased sequence. A delivery without a record of its own that a
-- block covers is leased by the block lease (listed in `block_lease_of` with its lease
-- id: not due, no record) past the frontier, acked by it at or behind. Such a record is
-- found through the lease's own id: a batch may name another lease of the sequence
-- first (one of a block that no longer covers it), which finds none (false, as HMGET
-- answers) and must not hide the record the next one finds.
-- Returns the high water, the sequences (text) of the leases, the record of each
-- sequence, the block leases, and the blocks looked up (token -> {first, last}).
local function lookup(leases, frontier)
  local high_water = tonumber(redis.call('HGET', keys.meta, 'hw') or '0')
  local fields = {}
  for k, lease in ipairs(leases) do fields[k] = int_text(lease[SEQ]) end
  local stored = hmget(keys.records, fields)
  local record_of, block_lease_of, blocks = {}, {}, {}
  for k, seq_text in ipairs(fields) do
    if not record_of[seq_text] then
      local record = stored[k]
      local lease_id = leases[k][LEASE_ID]
      if not record and type(lease_id) == 'string' then
        local pos = string.find(lease_id, ':', 1, true)
        if pos then
          local token = string.sub(lease_id, 1, pos - 1)
          local block = blocks[token]
          if block == nil then
            block = NO_BLOCK
            local spec = redis.call('HGET', keys.blocks, token)
            if spec then
              local first, last = parse_block(spec)
              block = {first = first, last = last}
            end
            blocks[token] = block
          end
          local seq = leases[k][SEQ]
          if block and seq >= block.first and seq <= block.last
              and lease_id == block_lease_id(token, seq_text) then
            if seq <= frontier then
              record = ack_record('1', lease_id)
            else
              record = lease_record('1', lease_id)
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
-- The code of a lease that names nothing current, or nil with the parsed record: state,
-- attempt, lease id, settled_by, last error.
local function check(lease, record, high_water)
  local seq = lease[SEQ]
  if not record then
    if seq >= 1 and seq <= high_water then return GONE end
    return NO_DELIVERY
  end
  local state, attempt, lease_id, settled_by, _, _, last_error = parse_record(record)
  if lease_id ~= lease[LEASE_ID] then return LEASED_AGAIN end
  if lease[RECEIPT] ~= entry_id(seq) then return RECEIPT_MISMATCH end
  return nil, state, attempt, lease_id, settled_by, last_error
end
-- Whether the consumer group's PEL holds an entry of the sequences first..last: only
-- those need an XACK. An unordered group's new deliveries never enter it (see
-- fetch.lua); its redeliveries, the deliveries of a key-ordered group and the leases of
-- releases that put every delivery there do.
local function pel_holds(first, last)
  return #redis.call('XPENDING', keys.stream, ARGV[1], entry_id(first), entry_id(last), 1) > 0
end
