-- include: now_ms
-- include: ready_score
-- include: emit
-- include: mark_ready
-- include: add_ready
-- include: is_leased
-- include: keyed_ctx
-- include: free_slot

-- Hand leased jobs back to the ready set at their old place, without waiting for the
-- lease to lapse: a stopping worker returns what it claimed but did not finish. A job
-- whose abort was asked (Job.abort()) is not run again: its lease is made to lapse now,
-- so the next reclaim ends it cancelled with its dependants told (reclaim.lua).
--
-- KEYS[1] active     ZSET  leased job ids by lease deadline (ms)
-- KEYS[2] ready      ZSET  job ids by ready score
-- KEYS[3] marker     ZSET  wake-up marks for idle workers
-- KEYS[4] events     STREAM lifecycle events
-- KEYS[5] job key prefix (job keys are KEYS[5] .. id; same hash tag)
-- KEYS[6..10] the shard's concurrency-key keys (keyed_ctx.lua)
--
-- ARGV[1] events stream bounds, `maxlen:max_bytes` (events_cap in emit.lua)
-- ARGV[2] 1: the jobs never started, so their attempt is not counted; 0: it is
-- ARGV[3..] per job, 2 values: id, attempt (the lease token)
--
-- Returns the number of jobs handed back (an aborted one is not).

local active, ready, marker, events, job_prefix = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local maxlen, uncount = events_cap(ARGV[1]), ARGV[2] == '1'
local now = now_ms()
local released, to_ready = 0, {}
for i = 3, #ARGV, 2 do
  local job_id, attempt = ARGV[i], ARGV[i + 1]
  local job_key = job_prefix .. job_id
  local f = redis.call('HMGET', job_key, 's', 'n', 'p', 'q', 'ck', 'ab')
  if f[6] and is_leased(f[1]) and f[2] == attempt then
    redis.call('ZADD', active, 'XX', 0, job_id)
  elseif is_leased(f[1]) and f[2] == attempt and redis.call('ZREM', active, job_id) == 1 then
    if uncount and redis.call('HINCRBY', job_key, 'n', -1) == 0 then
      redis.call('HDEL', job_key, 'n')  -- 0 attempts is the default: not stored
    end
    mark_ready(job_key)
    to_ready[#to_ready + 1] = ready_score(tonumber(f[3]) or 0, tonumber(f[4]) or 0)
    to_ready[#to_ready + 1] = job_id
    emit(events, maxlen, 'released', job_id, now, 'attempt', attempt)
    released = released + 1
    if f[5] then
      free_slot(keyed_ctx(6), f[5], ready, marker, job_prefix)
    end
  end
end
add_ready(ready, to_ready, marker)
return released
