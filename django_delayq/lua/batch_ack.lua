-- include: slice

-- Acknowledge a finished batch (engine/streams.py): its entries, and its record if it is
-- still this consumer's (another consumer may have taken the batch over meanwhile; it
-- then finishes it again, into the same files, and acknowledges it itself).
--
-- KEYS[1] stream   STREAM the queue shard's events
-- KEYS[2] batches  HASH   consumer -> '<first id> <last id>' of its batch in progress
--
-- ARGV[1] group, ARGV[2] consumer, ARGV[3] the batch's record ('<first> <last>'),
-- ARGV[4..] the entry ids
--
-- Returns how many entries were acknowledged (pending until now).

local stream, batches = KEYS[1], KEYS[2]
local group, consumer = ARGV[1], ARGV[2]
local acked = 0
for start = 4, #ARGV, SLICE do
  acked = acked + redis.call('XACK', stream, group,
    unpack(ARGV, start, math.min(start + SLICE - 1, #ARGV)))
end
if redis.call('HGET', batches, consumer) == ARGV[3] then
  redis.call('HDEL', batches, consumer)
end
return acked
