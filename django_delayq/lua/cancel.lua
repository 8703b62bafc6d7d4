-- Cancel a job that has not started: remove it from the scheduled or ready set. A
-- running or finished job is left as it is.
--
-- KEYS[1] job        HASH  the job
-- KEYS[2] scheduled  ZSET  job ids by run_at (ms)
-- KEYS[3] ready      ZSET  job ids by ready score
-- KEYS[4] cancelled  ZSET  cancelled job ids by cancel time (ms)
-- KEYS[5] events     STREAM lifecycle events
--
-- ARGV[1] job id
-- ARGV[2] cancelled job time to live (ms)
-- ARGV[3] most cancelled ids to keep
-- ARGV[4] events stream max length (0: no events)
--
-- Returns the job's status before the call ('' when there is no such job); the job was
-- cancelled when that status is 'scheduled' or 'ready'.

local job_key, job_id = KEYS[1], ARGV[1]
local ttl, keep, maxlen = tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
local status = redis.call('HGET', job_key, 's')
if not status then
  return ''
end
if status ~= 'scheduled' and status ~= 'ready' then
  return status
end
local now = now_ms()
redis.call('ZREM', KEYS[2], job_id)
redis.call('ZREM', KEYS[3], job_id)
redis.call('HSET', job_key, 's', 'cancelled', 'f', now)
redis.call('ZADD', KEYS[4], now, job_id)
if ttl > 0 then
  redis.call('PEXPIRE', job_key, ttl)
end
trim_finished(KEYS[4], now, ttl, keep)
emit(KEYS[5], maxlen, 'cancelled', job_id, now)
return status
