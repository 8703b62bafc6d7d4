-- include: now_ms
-- include: emit
-- include: emit_jobs
-- include: histogram

-- Note that a worker's threads started claimed jobs: each becomes 'active' with its
-- start time. Sent in the worker's ack round trips (before the acks), so it costs no
-- round trip of its own. A job whose lease this attempt no longer holds is skipped.
-- Each start adds its lateness (start - run_at) to the stats hash's histogram 'hl',
-- whose count is the attempts started: a claim released or reclaimed before a thread
-- started it is no start (an ack of a job whose note never landed counts it instead:
-- complete.lua, fail.lua).
--
-- KEYS[1] events     STREAM lifecycle events
-- KEYS[2] job key prefix (job keys are KEYS[2] .. id; same hash tag)
-- KEYS[3] stats      HASH  the start-lateness histogram
--
-- ARGV[1] events stream bounds, `maxlen:max_bytes` (events_cap in emit.lua)
-- ARGV[2] worker id
-- ARGV[3..] per job, 3 values: id, attempt (the lease token), start ms (Redis clock,
--           as the worker estimates it)
--
-- Returns the number of jobs marked active.

local events, job_prefix = KEYS[1], KEYS[2]
local maxlen, worker = events_cap(ARGV[1]), ARGV[2]
local now = now_ms()
local ids, attempts, lateness = {}, {}, {}
for i = 3, #ARGV, 3 do
  local job_id, attempt = ARGV[i], ARGV[i + 1]
  local job_key = job_prefix .. job_id
  local f = redis.call('HMGET', job_key, 's', 'n', 'r', 'e')
  if f[1] == 'claimed' and f[2] == attempt then
    local began = math.min(tonumber(ARGV[i + 2]) or now, now)
    redis.call('HSET', job_key, 's', 'active', 'b', began)
    lateness[#lateness + 1] = began - (tonumber(f[3] or f[4]) or began)
    ids[#ids + 1] = job_id
    attempts[#attempts + 1] = attempt
  end
end
emit_jobs(events, maxlen, 'started', ids, now, attempts, 'worker', worker)
observe(KEYS[3], 'hl', lateness)
return #ids
