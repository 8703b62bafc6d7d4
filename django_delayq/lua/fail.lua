-- include: now_ms
-- include: emit
-- include: count_minute
-- include: trim_finished
-- include: schedule_job
-- include: is_leased
-- include: attempt_log
-- include: flows
-- include: notify_dependants
-- include: keyed_ctx
-- include: free_slot
-- include: histogram

-- Record a failed attempt: retry later through the scheduled set while attempts remain,
-- else dead-letter the job into the failed set, keeping its error and traceback. Only
-- the attempt that holds the lease may fail the job. A job whose abort was asked for
-- (field 'ab', cancel.lua) is never retried: it ends cancelled, its dependants resolved
-- as for a cancel.
--
-- KEYS[1] job        HASH  the job
-- KEYS[2] active     ZSET  leased job ids by lease deadline (ms)
-- KEYS[3] scheduled  ZSET  job ids by run_at (ms)
-- KEYS[4] failed     ZSET  dead-lettered job ids by failure time (ms)
-- KEYS[5] marker     ZSET  wake-up marks for idle workers
-- KEYS[6] events     STREAM lifecycle events
-- KEYS[7] stats      HASH  per-minute counters and totals, and the start lateness of an
--                           attempt whose start note never landed
--
-- ARGV[1] job id
-- ARGV[2] attempt (the lease token)
-- ARGV[3] error (one line: exception class and message)
-- ARGV[4] traceback (its end is kept in the attempt log too)
-- ARGV[5] retry delay (ms); -1: never retry this failure
-- ARGV[6] failed job time to live (ms; 0: keep the id only until trimmed)
-- ARGV[7] most failed ids to keep
-- ARGV[8] events stream bounds, `maxlen:max_bytes` (events_cap in emit.lua)
-- ARGV[9] when the attempt started (ms; for the attempt log)
-- KEYS[8..18], ARGV[10..12] the shard's keys and settings for resolving dependants
-- (flow_ctx in flows.lua)
-- KEYS[19..23] the shard's concurrency-key keys (keyed_ctx.lua): the attempt
--              frees its key's slot, retried or not
--
-- Returns {outcome, run_at, pushed}: outcome 'retried' (run_at is the retry time),
-- 'failed', 'cancelled' (aborted), or 'stale' (the attempt no longer holds the lease);
-- pushed counts the resolutions of dependants in other shards left in the outbox by a
-- failure for good (or an abort).

local job_key, active, scheduled, failed = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local job_id, attempt = ARGV[1], ARGV[2]
local retry_delay, ttl = tonumber(ARGV[5]), tonumber(ARGV[6])
local keep, maxlen = tonumber(ARGV[7]), events_cap(ARGV[8])
local now = now_ms()

local f = redis.call('HMGET', job_key, 's', 'n', 'm', 'w', 'b', 'dc', 'ck', 'ab', 'r', 'e')
if not is_leased(f[1]) or f[2] ~= attempt or redis.call('ZREM', active, job_id) == 0 then
  return {'stale', 0}
end
if f[7] then
  free_slot(keyed_ctx(19), f[7], KEYS[9], KEYS[10], KEYS[17])
end
local started = f[5] or (ARGV[9] and ARGV[9] ~= '0' and ARGV[9]) or nil
redis.call('HSET', job_key, 'x', ARGV[3], 'tb', ARGV[4], 'f', now)
if f[1] == 'claimed' then  -- failed before the note of its start landed
  emit(KEYS[6], maxlen, 'started', job_id, now, 'attempt', attempt)
  local began = math.min(tonumber(started) or now, now)
  observe(KEYS[7], 'hl', {began - (tonumber(f[9] or f[10]) or began)})
end
if started and not f[5] then
  redis.call('HSET', job_key, 'b', started)
end

if f[8] then  -- aborted: over, as a cancel is
  local flow = flow_ctx(8, 10)
  log_attempt(job_key, attempt, f[4], started, now, 'aborted', ARGV[3], ARGV[4])
  redis.call('HSET', job_key, 's', 'cancelled')
  redis.call('ZADD', flow.cancelled, now, job_id)
  if ttl > 0 then
    redis.call('PEXPIRE', job_key, ttl)
  end
  emit(KEYS[6], maxlen, 'cancelled', job_id, now, 'attempt', attempt, 'error', ARGV[3],
    'by', f[8])
  local pushed = 0
  if f[6] then
    pushed = notify_dependants(flow, job_id, 'cancelled', 'null', now)
  end
  trim_finished(flow.cancelled, flow.prefix, now, ttl, keep)
  return {'cancelled', 0, pushed}
end

if retry_delay >= 0 and tonumber(f[2]) < (tonumber(f[3]) or 1) then
  local run_at = now + retry_delay
  log_attempt(job_key, attempt, f[4], started, now, 'retried', ARGV[3], ARGV[4])
  schedule_job(scheduled, KEYS[5], job_key, job_id, run_at)
  redis.call('HINCRBY', KEYS[7], 'r', 1)  -- failed attempts retried, in total
  emit(KEYS[6], maxlen, 'retried', job_id, now, 'attempt', attempt, 'run_at', run_at,
    'error', ARGV[3])
  return {'retried', run_at}
end

log_attempt(job_key, attempt, f[4], started, now, 'failed', ARGV[3], ARGV[4])
redis.call('HSET', job_key, 's', 'failed')
redis.call('ZADD', failed, now, job_id)
if ttl > 0 then
  redis.call('PEXPIRE', job_key, ttl)
end
count_minute(KEYS[7], 'f', now, 1)
emit(KEYS[6], maxlen, 'failed', job_id, now, 'attempt', attempt, 'error', ARGV[3])
local pushed = 0
if f[6] then
  pushed = notify_dependants(flow_ctx(8, 10), job_id, 'failed', 'null', now)
end
trim_finished(failed, KEYS[17], now, ttl, keep)
return {'failed', 0, pushed}
