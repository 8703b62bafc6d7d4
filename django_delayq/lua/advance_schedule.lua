-- include: schedule_record

-- Record that a periodic task's occurrences up to a time are enqueued. The mark only
-- moves forward, so a slow worker finishing late cannot move it back; and with a tag,
-- only while the task's record names that schedule: a scheduler that another one's
-- schedule replaced since its step began leaves the mark alone.
--
-- KEYS[1] schedules  HASH  task name -> latest occurrence enqueued (ms); the task's
--                          record field -> its schedule record (hold_schedule.lua)
--
-- ARGV[1] task name
-- ARGV[2] occurrence (ms)
-- ARGV[3] (optional) the task's record field
-- ARGV[4] (optional) the tag of the caller's schedule
--
-- Returns the mark after the call (ms), or -1 when the record names another schedule.

if ARGV[4] then
  local tag = schedule_record(redis.call('HGET', KEYS[1], ARGV[3]))
  if tag and tag ~= ARGV[4] then
    return -1
  end
end
local current = tonumber(redis.call('HGET', KEYS[1], ARGV[1]))
local wanted = tonumber(ARGV[2])
if current == nil or wanted > current then
  redis.call('HSET', KEYS[1], ARGV[1], wanted)
  return wanted
end
return current
