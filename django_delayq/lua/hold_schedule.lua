-- include: schedule_record

-- Which schedule a periodic task runs on, asked by a scheduler at each step before it
-- plans: its own (the record names it, or names none: a mark older than records is a
-- mark of the same schedule), a schedule it now replaces, or one that replaced its own.
-- A scheduler replaces the schedule of the record when it started after every
-- scheduler that stepped with that schedule (a deploy's new processes), or when none
-- has stepped for ARGV[6] ms (its processes are gone). Each replacement raises the
-- record's since, or takes a schedule nobody runs, so two live schedules cannot take
-- the task back and forth: the older processes hold off until they stop.
--
-- KEYS[1] schedules  HASH  task name -> latest occurrence enqueued (ms); the task's
--                          record field -> '<tag> <since> <seen> <spec>'
--
-- ARGV[1] task name (its mark's field)
-- ARGV[2] the task's record field
-- ARGV[3] the tag of the caller's schedule
-- ARGV[4] when the caller started (ms)
-- ARGV[5] now (ms)
-- ARGV[6] after how long (ms) with no step a schedule is replaced whatever its since
-- ARGV[7] the caller's schedule as JSON
-- ARGV[8] the mark to set when the caller's schedule replaces another (ms)
--
-- Returns {'same', mark or ''} (the record names the caller's schedule, or named
-- none), {'switch', the mark before, the replaced schedule's JSON} (the mark is now
-- ARGV[8]), or {'held', the record's schedule JSON} (the caller's is out of date).

local since, now = tonumber(ARGV[4]), tonumber(ARGV[5])
local tag, held_since, seen, spec = schedule_record(redis.call('HGET', KEYS[1], ARGV[2]))
local mark = redis.call('HGET', KEYS[1], ARGV[1]) or ''

local function keep(since_ms)
  redis.call('HSET', KEYS[1], ARGV[2], string.format('%s %d %d %s', ARGV[3], since_ms,
                                                    now, ARGV[7]))
end

if not tag or tag == ARGV[3] then
  keep(math.max(since, held_since or 0))
  return {'same', mark}
end
if since > held_since or now - seen > tonumber(ARGV[6]) then
  keep(math.max(since, held_since))
  redis.call('HSET', KEYS[1], ARGV[1], ARGV[8])
  return {'switch', mark, spec}
end
return {'held', spec}
