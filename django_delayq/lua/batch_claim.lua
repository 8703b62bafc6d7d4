-- include: slice

-- Take over the batch in progress of a consumer of a stream's group (engine/streams.py):
-- the entries of its recorded batch still pending to it, all at once, or none.
--
-- A consumer taking back its own batch (after a crash or an error) passes min idle 0;
-- another passes its take-over delay: the batch moves only if every entry of it has
-- been idle that long, so a consumer still working on it keeps it, and two consumers
-- never split one batch. A consumer with entries pending but no batch recorded gives
-- those, up to the count, as its batch.
--
-- KEYS[1] stream   STREAM the queue shard's events
-- KEYS[2] batches  HASH   consumer -> '<first id> <last id>' of its batch in progress
--
-- ARGV[1] group, ARGV[2] the consumer whose batch it is, ARGV[3] the consumer taking it
-- ARGV[4] min idle (ms), ARGV[5] most entries of a batch with no record
--
-- Returns {'none'} (no batch, or the taker has one of its own in progress, or an entry
-- is not idle enough), else {'ok', first id, last id, deleted ids (entries gone from the
-- stream, acknowledged here) joined by spaces, entries...} (each {id, {field, value...}}).

local stream, batches = KEYS[1], KEYS[2]
local group, owner, taker = ARGV[1], ARGV[2], ARGV[3]
local min_idle = tonumber(ARGV[4])
if owner ~= taker and redis.call('HEXISTS', batches, taker) == 1 then
  return {'none'}
end
local record = redis.call('HGET', batches, owner)
local first, last
if record then
  first, last = string.match(record, '^(%S+) (%S+)$')
end
local pending
if first then
  pending = redis.call('XPENDING', stream, group, first, last, 1000000, owner)
else
  pending = redis.call('XPENDING', stream, group, '-', '+', tonumber(ARGV[5]), owner)
end
if #pending == 0 then
  redis.call('HDEL', batches, owner)  -- finished, its record left behind: forget it
  return {'none'}
end
local ids = {}
for i = 1, #pending do
  if pending[i][3] < min_idle then
    return {'none'}
  end
  ids[i] = pending[i][1]
end
if not first then
  first, last = ids[1], ids[#ids]
end
local out = {'ok', first, last, ''}
local found = {}
for start = 1, #ids, SLICE do
  local claimed = redis.call('XCLAIM', stream, group, taker, 0,
    unpack(ids, start, math.min(start + SLICE - 1, #ids)))
  for i = 1, #claimed do
    if claimed[i] then
      found[claimed[i][1]] = true
      out[#out + 1] = claimed[i]
    end
  end
end
local deleted = {}
for i = 1, #ids do
  if not found[ids[i]] then
    deleted[#deleted + 1] = ids[i]
  end
end
for start = 1, #deleted, SLICE do
  redis.call('XACK', stream, group, unpack(deleted, start, math.min(start + SLICE - 1, #deleted)))
end
out[4] = table.concat(deleted, ' ')
redis.call('HDEL', batches, owner)
redis.call('HSET', batches, taker, first .. ' ' .. last)
return out
