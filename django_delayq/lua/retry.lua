-- include: now_ms
-- include: emit
-- include: place_job
-- include: wanted_run_at

-- Run a failed or cancelled job again with a fresh budget of attempts; its error is
-- cleared. The attempt count goes on (attempt n+1 follows attempt n) and max_attempts
-- grows by the attempts used: the attempt number is the lease token every ack checks,
-- so a worker whose lease lapsed in an earlier run can never complete or fail this
-- one, and the attempt log stays one entry per run.
--
-- KEYS[1] job        HASH  the job
-- KEYS[2] failed     ZSET  dead-lettered job ids
-- KEYS[3] cancelled  ZSET  cancelled job ids
-- KEYS[4] scheduled  ZSET  job ids by run_at (ms)
-- KEYS[5] ready      ZSET  job ids by ready score
-- KEYS[6] marker     ZSET  wake-up marks for idle workers
-- KEYS[7] events     STREAM lifecycle events
-- KEYS[8] seq        STRING FIFO counter
--
-- ARGV[1] job id
-- ARGV[2] run_at ms ('' for none)
-- ARGV[3] delay ms from the Redis clock ('' for none; both empty: now)
-- ARGV[4] events stream bounds, `maxlen:max_bytes` (events_cap in emit.lua)
--
-- Returns {status before ('' when there is no such job), status after, and when it
-- was retried its attempts so far and new max_attempts}; only a 'failed' or
-- 'cancelled' job is retried.

local job_key, job_id = KEYS[1], ARGV[1]
local f = redis.call('HMGET', job_key, 's', 'p', 'n', 'm')
local status = f[1]
if not status then
  return {'', '', 0, 1}
end
if status ~= 'failed' and status ~= 'cancelled' then
  return {status, status, 0, 1}
end
local now = now_ms()
redis.call('ZREM', KEYS[2], job_id)
redis.call('ZREM', KEYS[3], job_id)
redis.call('PERSIST', job_key)
redis.call('PERSIST', job_key .. ':c')  -- its dependants (flows.lua) live as long as it
-- error, traceback, finished_at, started_at, worker, result; an abort was that run's
redis.call('HDEL', job_key, 'x', 'tb', 'f', 'b', 'w', 'v', 'ab')
local used, most = tonumber(f[3]) or 0, tonumber(f[4]) or 1
if used > 0 then
  most = most + used
  redis.call('HSET', job_key, 'm', most)
end
local k = {scheduled = KEYS[4], ready = KEYS[5], marker = KEYS[6], seq = KEYS[8]}
local run_at = wanted_run_at(ARGV[2], ARGV[3], now)
local after = place_job(k, job_key, job_id, tonumber(f[2]) or 0, run_at, now)
emit(KEYS[7], events_cap(ARGV[4]), 'retried', job_id, now, 'run_at', run_at, 'manual', 1,
  'max_attempts', most)
return {status, after, used, most}
