-- include: now_ms
-- include: emit
-- include: trim_finished
-- include: flows
-- include: notify_dependants
-- include: keyed_ctx
-- include: wake_parked
-- include: unpark
-- include: drop_turn

-- Cancel a job that has not started: remove it from the scheduled, ready or waiting
-- set, and resolve its dependants (flows.lua). A finished job is left as it is. A running
-- (claimed or active) one is asked to stop when ARGV[8] names who asks: the field 'ab'
-- holds it, the worker's heartbeat (extend.lua) hears of it, and the attempt's end
-- (fail.lua) makes the job cancelled.
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
-- ARGV[4] events stream bounds, `maxlen:max_bytes` (events_cap in emit.lua)
-- ARGV[8] who asks ('' or absent: cancel a job that has not started only)
-- KEYS[6..16], ARGV[5..7] the shard's keys and settings for resolving dependants
-- (flow_ctx in flows.lua)
-- KEYS[17..21] the shard's concurrency-key keys (keyed_ctx.lua): a ready job of a key
-- may be the one a freed slot woke; cancelled before its claim, it wakes the next
--
-- Returns {the job's status before the call ('' when there is no such job), resolutions
-- of dependants in other shards left in the outbox}; the job was cancelled when that
-- status is 'waiting', 'scheduled' or 'ready', and asked to stop when it is 'claimed' or
-- 'active' and ARGV[8] was given.

local job_key, job_id = KEYS[1], ARGV[1]
local ttl, keep, maxlen = tonumber(ARGV[2]), tonumber(ARGV[3]), events_cap(ARGV[4])
local who = ARGV[8] or ''
local status = redis.call('HGET', job_key, 's')
if not status then
  return {'', 0}
end
if (status == 'claimed' or status == 'active') and who ~= '' then
  if redis.call('HSETNX', job_key, 'ab', who) == 1 then
    emit(KEYS[5], maxlen, 'aborting', job_id, now_ms(), 'by', who)
  end
  return {status, 0}
end
if status ~= 'scheduled' and status ~= 'ready' and status ~= 'waiting' then
  return {status, 0}
end
local flow = flow_ctx(6, 5)
local now = now_ms()
redis.call('ZREM', KEYS[2], job_id)
local was_ready = redis.call('ZREM', KEYS[3], job_id) == 1
local keyed = redis.call('HMGET', job_key, 'ck', 'kw', 'q')
if keyed[1] then
  local kc = keyed_ctx(17)
  if keyed[2] then  -- parked: out of the park set, so no count or purge sees it
    unpark(kc, keyed[1], job_key, job_id)
  elseif was_ready then  -- maybe the one a freed slot woke: wake the next
    wake_parked(kc, keyed[1], KEYS[3], flow.marker, flow.prefix)
  end
  drop_turn(kc, keyed[1], keyed[3])
end
if status == 'waiting' then
  redis.call('ZREM', flow.waiting, job_id)
  redis.call('DEL', job_key .. ':w', job_key .. ':r')
end
redis.call('HSET', job_key, 's', 'cancelled', 'f', now)
if who ~= '' then
  redis.call('HSET', job_key, 'ab', who)
end
redis.call('ZADD', KEYS[4], now, job_id)
if ttl > 0 then
  redis.call('PEXPIRE', job_key, ttl)
end
emit(KEYS[5], maxlen, 'cancelled', job_id, now)
local pushed = 0
if redis.call('HGET', job_key, 'dc') then
  pushed = notify_dependants(flow, job_id, 'cancelled', 'null', now)
end
trim_finished(KEYS[4], flow.prefix, now, ttl, keep)
return {status, pushed}
