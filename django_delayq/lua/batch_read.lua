-- Read a batch of new entries of a stream through a consumer group, and record the
-- batch (its first and last id) as this consumer's batch in progress, in one step.
--
-- A reader whose work must not be done twice (the lake exporter: engine/streams.py)
-- reads this way: whoever finishes a batch later (this consumer, or another that takes
-- it over) finishes exactly this batch, so it writes the same files.
--
-- KEYS[1] stream   STREAM the queue shard's events
-- KEYS[2] batches  HASH   consumer -> '<first id> <last id>' of its batch in progress
--
-- ARGV[1] group, ARGV[2] consumer, ARGV[3] most entries
--
-- Returns {'busy'} when the consumer has a batch in progress already (finish it first),
-- else {'ok', entries...}: each entry as XREADGROUP gives it ({id, {field, value...}}).

local stream, batches = KEYS[1], KEYS[2]
local group, consumer = ARGV[1], ARGV[2]
if redis.call('HEXISTS', batches, consumer) == 1 then
  return {'busy'}
end
local reply = redis.call('XREADGROUP', 'GROUP', group, consumer, 'COUNT', tonumber(ARGV[3]),
  'STREAMS', stream, '>')
local out = {'ok'}
if not reply or not reply[1] then
  return out
end
local entries = reply[1][2]
if #entries > 0 then
  redis.call('HSET', batches, consumer, entries[1][1] .. ' ' .. entries[#entries][1])
end
for i = 1, #entries do
  out[#out + 1] = entries[i]
end
return out
