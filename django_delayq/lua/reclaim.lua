-- include: now_ms
-- include: ready_score
-- include: emit
-- include: count_minute
-- include: trim_finished
-- include: mark_ready
-- include: add_ready
-- include: attempt_log
-- include: flows
-- include: notify_dependants
-- include: keyed_ctx
-- include: free_slot

-- Return jobs whose lease expired (their worker died or froze) to the ready set at
-- their old place; a job that has used all its attempts is dead-lettered instead, so a
-- job that kills its worker every time cannot loop forever. A job whose abort was asked
-- (Job.abort()) ends cancelled, as its attempt's end would have ended it (fail.lua).
--
-- With a worker name (ARGV[9]), the leases of that worker instead, whatever their
-- deadline: its host saw the process end and hands its jobs back at once. Its jobs that
-- never started ('claimed') go back with their attempt uncounted.
--
-- KEYS[1] active     ZSET  leased job ids by lease deadline (ms)
-- KEYS[2] ready      ZSET  job ids by ready score
-- KEYS[3] failed     ZSET  dead-lettered job ids by failure time (ms)
-- KEYS[4] marker     ZSET  wake-up marks for idle workers
-- KEYS[5] events     STREAM lifecycle events
-- KEYS[6] stats      HASH  per-minute counters
-- KEYS[7] job key prefix (job keys are KEYS[7] .. id; same hash tag)
--
-- ARGV[1] most jobs to reclaim in this call
-- ARGV[2] failed job time to live (ms)
-- ARGV[3] most failed ids to keep
-- ARGV[4] events stream bounds, `maxlen:max_bytes` (events_cap in emit.lua)
-- KEYS[8..18], ARGV[5..7] the shard's keys and settings for resolving dependants
-- (flow_ctx in flows.lua)
-- KEYS[19] linking   ZSET  waiting jobs whose links to parents elsewhere are not yet
--                          confirmed, by enqueued time or the latest hand-over below
--                          (flows.lua)
-- KEYS[20..24] the shard's concurrency-key keys (keyed_ctx.lua): each job
--              taken out of the active set frees its key's slot
-- ARGV[8] grace (ms): how long a producer may take to confirm those links
-- ARGV[9] a worker name, or '' (optional): see above
-- ARGV[10] with a worker name: the rank in the active set where this call's scan of
-- ARGV[1] leases begins
--
-- Returns {ids returned to ready, ids dead-lettered, entries in the shard's outbox of
-- dependants' resolutions (flows.lua) still to deliver, the ids of waiting jobs whose
-- links are unconfirmed past the grace (at most ARGV[1]), for the caller to link again,
-- with a worker name the rank where the next call goes on (-1: the scan is over)}.
-- Those ids are handed to this caller alone: their time in the linking set becomes now,
-- so another caller gets them only if they are still unconfirmed a grace later.

local active, ready, failed, marker = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local events, stats, job_prefix = KEYS[5], KEYS[6], KEYS[7]
local ttl, keep, maxlen = tonumber(ARGV[2]), tonumber(ARGV[3]), events_cap(ARGV[4])
local now = now_ms()
local flow = flow_ctx(8, 5)
local limit, worker, next_rank = tonumber(ARGV[1]), ARGV[9] or '', -1
local expired, why = {}, ' stopped renewing the lease'
if worker == '' then
  expired = redis.call('ZRANGEBYSCORE', active, '-inf', '(' .. now, 'LIMIT', 0, limit)
else
  local rank = tonumber(ARGV[10])
  local page = redis.call('ZRANGE', active, rank, rank + limit - 1)
  for i = 1, #page do
    if redis.call('HGET', job_prefix .. page[i], 'w') == worker then
      expired[#expired + 1] = page[i]
    end
  end
  if #page == limit then
    next_rank = rank + limit - #expired  -- what this call takes out shifts the rest
  end
  why = ' ended while it held the job'
end
local returned, dead, aborted, to_ready = 0, 0, 0, {}
for i = 1, #expired do
  local job_id = expired[i]
  local job_key = job_prefix .. job_id
  redis.call('ZREM', active, job_id)
  local f = redis.call('HMGET', job_key, 'n', 'm', 'p', 'q', 'w', 'b', 'dc', 's', 'ck', 'ab')
  if f[9] then
    free_slot(keyed_ctx(20), f[9], ready, marker, job_prefix)
  end
  local reason = (worker == '' and 'LeaseExpired' or 'WorkerLost') .. ': worker '
    .. (f[5] or '?') .. why
  if redis.call('EXISTS', job_key) == 0 then
    emit(events, maxlen, 'orphaned', job_id, now)
  elseif f[10] then  -- its abort was asked: over, as fail.lua ends an aborted attempt
    local error = 'JobAborted: aborted by ' .. f[10] .. '; ' .. reason
    if f[8] == 'claimed' then  -- never started: not an attempt
      if redis.call('HINCRBY', job_key, 'n', -1) == 0 then
        redis.call('HDEL', job_key, 'n')
      end
    else
      log_attempt(job_key, f[1], f[5], f[6], now, 'aborted', error)
    end
    redis.call('HSET', job_key, 's', 'cancelled', 'x', error, 'f', now)
    redis.call('ZADD', flow.cancelled, now, job_id)
    if ttl > 0 then
      redis.call('PEXPIRE', job_key, ttl)
    end
    emit(events, maxlen, 'cancelled', job_id, now, 'attempt', f[1], 'error', error, 'by', f[10])
    if f[7] then
      notify_dependants(flow, job_id, 'cancelled', 'null', now)
    end
    aborted = aborted + 1
  elseif worker ~= '' and f[8] == 'claimed' then  -- never started: not an attempt
    if redis.call('HINCRBY', job_key, 'n', -1) == 0 then
      redis.call('HDEL', job_key, 'n')
    end
    mark_ready(job_key)
    to_ready[#to_ready + 1] = ready_score(tonumber(f[3]) or 0, tonumber(f[4]) or 0)
    to_ready[#to_ready + 1] = job_id
    emit(events, maxlen, 'released', job_id, now, 'attempt', f[1])
    returned = returned + 1
  elseif (tonumber(f[1]) or 1) >= (tonumber(f[2]) or 1) then
    log_attempt(job_key, f[1], f[5], f[6], now, 'reclaimed', reason)
    redis.call('HSET', job_key, 's', 'failed', 'x', reason, 'f', now)
    redis.call('ZADD', failed, now, job_id)
    if ttl > 0 then
      redis.call('PEXPIRE', job_key, ttl)
    end
    count_minute(stats, 'f', now, 1)
    emit(events, maxlen, 'failed', job_id, now, 'attempt', f[1], 'error', reason)
    if f[7] then
      notify_dependants(flow, job_id, 'failed', 'null', now)
    end
    dead = dead + 1
  else
    log_attempt(job_key, f[1], f[5], f[6], now, 'reclaimed', reason)
    mark_ready(job_key)
    to_ready[#to_ready + 1] = ready_score(tonumber(f[3]) or 0, tonumber(f[4]) or 0)
    to_ready[#to_ready + 1] = job_id
    emit(events, maxlen, 'reclaimed', job_id, now, 'attempt', f[1], 'worker', f[5] or '')
    redis.call('HINCRBY', stats, 'r', 1)  -- a failed attempt retried, as fail.lua counts
    returned = returned + 1
  end
end
if dead > 0 then
  trim_finished(failed, job_prefix, now, ttl, keep)
end
if aborted > 0 then
  trim_finished(flow.cancelled, job_prefix, now, ttl, keep)
end
add_ready(ready, to_ready, marker)
local unlinked = {}
if worker == '' then
  unlinked = redis.call('ZRANGEBYSCORE', KEYS[19], '-inf', now - tonumber(ARGV[8]),
    'LIMIT', 0, limit)
  for i = 1, #unlinked do
    redis.call('ZADD', KEYS[19], 'XX', now, unlinked[i])
  end
end
return {returned, dead, redis.call('LLEN', flow.outbox), unlinked, next_rank}
