-- Read a batch of new entries of a stream through a consumer group, and record the
-- batch (its first and last id) as this consumer's batch in progress, in one step.
--
-- Every reader of the streams (the model mirror, the lake exporter: engine/streams.py)
-- reads this way: whoever finishes a batch later (this consumer, or another that takes
-- it over) finishes exactly this batch, so its work is done once, or done again whole.
--
-- KEYS[1] stream   STREAM the queue shard's events
-- KEYS[2] batches  HASH   consumer -> '<first id> <last id>' of its batch in progress
--
-- ARGV[1] group, ARGV[2] consumer, ARGV[3] most entries
--
-- Returns {'busy'} when the consumer has a batch in progress already (finish it first),
-- else {'ok', tail, entries...}: tail, the id of the stream's newest entry ('0-0' when it
-- is empty: a reader that read nothing waits for entries after it), then each entry as
-- XREADGROUP gives it ({id, {field, value...}}).

local stream, batches = KEYS[1], KEYS[2]
local group, consumer = ARGV[1], ARGV[2]
if redis.call('HEXISTS', batches, consumer) == 1 then
  return {'busy'}
end
local reply = redis.call('XREADGROUP', 'GROUP', group, consumer, 'COUNT', tonumber(ARGV[3]),
  'STREAMS', stream, '>')
local newest = redis.call('XREVRANGE', stream, '+', '-', 'COUNT', 1)
local out = {'ok', newest[1] and newest[1][1] or '0-0'}
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
