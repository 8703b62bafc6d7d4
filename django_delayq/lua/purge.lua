-- Delete up to N jobs of one status set, with their job hashes. Called in a loop until
-- it returns 0, so a large queue is purged without blocking Redis for long.
--
-- KEYS[1] the status set (scheduled, ready, completed, failed or cancelled)  ZSET
-- KEYS[2] events     STREAM lifecycle events
-- KEYS[3] job key prefix (job keys are KEYS[3] .. id; same hash tag)
--
-- ARGV[1] most jobs to delete in this call
-- ARGV[2] events stream max length (0: no events)
--
-- Returns the number of ids removed.

local popped = redis.call('ZPOPMIN', KEYS[1], tonumber(ARGV[1]))
local now = now_ms()
local maxlen = tonumber(ARGV[2])
for i = 1, #popped, 2 do
  redis.call('DEL', KEYS[3] .. popped[i])
  emit(KEYS[2], maxlen, 'purged', popped[i], now)
end
return #popped / 2
