-- Keep a finished-jobs ZSET to ids younger than ttl_ms and at most keep entries, and
-- delete the job records of the ids it drops (the hash and its children set), so KEEP_*
-- bounds the records, not only the index, and a dropped id no longer deduplicates. A
-- record whose status is no longer a finished one (its id was enqueued again after the
-- record expired) is left alone. At most TRIM_BATCH ids a call: a lowered KEEP_* is
-- caught up over the next calls, never in one long script.
local TRIM_BATCH = 1000
local FINISHED_STATUS = {completed = true, failed = true, cancelled = true}
local function trim_finished(set_key, job_prefix, now, ttl_ms, keep)
  local dropped = {}
  if ttl_ms > 0 then
    dropped = redis.call('ZRANGEBYSCORE', set_key, '-inf', '(' .. (now - ttl_ms),
      'LIMIT', 0, TRIM_BATCH)
  end
  if keep >= 0 then
    local extra = redis.call('ZCARD', set_key) - #dropped - keep
    if extra > 0 then
      local oldest = redis.call('ZRANGE', set_key, #dropped,
        #dropped + math.min(extra, TRIM_BATCH) - 1)
      for i = 1, #oldest do
        dropped[#dropped + 1] = oldest[i]
      end
    end
  end
  if #dropped == 0 then
    return
  end
  redis.call('ZREM', set_key, unpack(dropped))
  for i = 1, #dropped do
    local job_key = job_prefix .. dropped[i]
    if FINISHED_STATUS[redis.call('HGET', job_key, 's') or 'completed'] then
      redis.call('DEL', job_key, job_key .. ':c')
    end
  end
end
