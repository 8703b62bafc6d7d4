-- Record that a periodic task's occurrences up to a time are enqueued. The mark only
-- moves forward, so a slow worker finishing late cannot move it back.
--
-- KEYS[1] schedules  HASH  task name -> latest occurrence enqueued (ms)
--
-- ARGV[1] task name
-- ARGV[2] occurrence (ms)
--
-- Returns the mark after the call (ms).

local current = tonumber(redis.call('HGET', KEYS[1], ARGV[1]))
local wanted = tonumber(ARGV[2])
if current == nil or wanted > current then
  redis.call('HSET', KEYS[1], ARGV[1], wanted)
  return wanted
end
return current
