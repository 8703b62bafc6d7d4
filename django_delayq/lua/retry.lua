-- include: now_ms
-- include: emit
-- include: place_job
-- include: wanted_run_at

-- Run a failed or cancelled job again: its attempts start over and its error is cleared.
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
-- Returns {status before ('' when there is no such job), status after}; only a
-- 'failed' or 'cancelled' job is retried.

local job_key, job_id = KEYS[1], ARGV[1]
local f = redis.call('HMGET', job_key, 's', 'p')
local status = f[1]
if not status then
  return {'', ''}
end
if status ~= 'failed' and status ~= 'cancelled' then
  return {status, status}
end
local now = now_ms()
redis.call('ZREM', KEYS[2], job_id)
redis.call('ZREM', KEYS[3], job_id)
redis.call('PERSIST', job_key)
redis.call('PERSIST', job_key .. ':c')  -- its dependants (flows.lua) live as long as it
-- error, traceback, finished_at, started_at, worker, result; and attempts, back to its
-- default 0
redis.call('HDEL', job_key, 'x', 'tb', 'f', 'b', 'w', 'v', 'n', 'ab')  -- an abort was this run's
local k = {scheduled = KEYS[4], ready = KEYS[5], marker = KEYS[6], seq = KEYS[8]}
local run_at = wanted_run_at(ARGV[2], ARGV[3], now)
local after = place_job(k, job_key, job_id, tonumber(f[2]) or 0, run_at, now)
emit(KEYS[7], events_cap(ARGV[4]), 'retried', job_id, now, 'run_at', run_at, 'manual', 1)
return {status, after}
