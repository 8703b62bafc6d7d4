-- include: now_ms
-- include: emit
-- include: place_job
-- include: wanted_run_at
-- include: keyed_ctx
-- include: wake_parked
-- include: unpark
-- include: drop_turn

-- Move a job that has not started to a new run_at (and optionally a new priority).
--
-- KEYS[1] job        HASH  the job
-- KEYS[2] scheduled  ZSET  job ids by run_at (ms)
-- KEYS[3] ready      ZSET  job ids by ready score
-- KEYS[4] marker     ZSET  wake-up marks for idle workers
-- KEYS[5] events     STREAM lifecycle events
-- KEYS[6] seq        STRING FIFO counter
-- KEYS[7..11] the shard's concurrency-key keys (keyed_ctx.lua): a ready job of a key
-- may be the one a freed slot woke; moved before its claim, it wakes the next
-- KEYS[12] job key prefix (the parked jobs' keys are KEYS[12] .. id; same hash tag)
--
-- ARGV[1] job id
-- ARGV[2] run_at ms ('' for none)
-- ARGV[3] delay ms from the Redis clock ('' for none; both empty: now)
-- ARGV[4] new priority ('' keeps the job's)
-- ARGV[5] events stream bounds, `maxlen:max_bytes` (events_cap in emit.lua)
--
-- Returns {status before ('' when there is no such job), status after, run_at ms}; the
-- job is moved only from 'scheduled' or 'ready'.

local job_key, job_id = KEYS[1], ARGV[1]
local f = redis.call('HMGET', job_key, 's', 'p', 'r', 'e')
local status = f[1]
if not status then
  return {'', '', 0}
end
if status ~= 'scheduled' and status ~= 'ready' then
  return {status, status, tonumber(f[3] or f[4]) or 0}
end
local now = now_ms()
local priority = tonumber(f[2]) or 0
if ARGV[4] ~= '' then
  priority = tonumber(ARGV[4])
  if priority == 0 then
    redis.call('HDEL', job_key, 'p')  -- the default: not stored
  else
    redis.call('HSET', job_key, 'p', priority)
  end
end
local run_at = wanted_run_at(ARGV[2], ARGV[3], now)
redis.call('ZREM', KEYS[2], job_id)
local was_ready = redis.call('ZREM', KEYS[3], job_id) == 1
local keyed = redis.call('HMGET', job_key, 'ck', 'kw', 'q')
if keyed[1] then
  local kc = keyed_ctx(7)
  if keyed[2] then  -- parked: it waits for no slot where it goes
    unpark(kc, keyed[1], job_key, job_id)
  elseif was_ready then  -- maybe the one a freed slot woke: wake the next
    wake_parked(kc, keyed[1], KEYS[3], KEYS[4], KEYS[12])
  end
  drop_turn(kc, keyed[1], keyed[3])  -- moved: it leaves its key's turns
end
local k = {scheduled = KEYS[2], ready = KEYS[3], marker = KEYS[4], seq = KEYS[6]}
local after = place_job(k, job_key, job_id, priority, run_at, now)
emit(KEYS[5], events_cap(ARGV[5]), 'rescheduled', job_id, now, 'run_at', run_at)
return {status, after, run_at}
