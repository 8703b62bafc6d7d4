-- Put a job in the scheduled set and wake an idle worker if it is the new head.
local function schedule_job(scheduled_key, marker_key, job_key, job_id, run_at)
  local head = redis.call('ZRANGE', scheduled_key, 0, 0, 'WITHSCORES')
  redis.call('ZADD', scheduled_key, run_at, job_id)
  redis.call('HSET', job_key, 's', 'scheduled', 'r', run_at)
  if head[2] == nil or run_at < tonumber(head[2]) then
    redis.call('ZADD', marker_key, run_at, '1')
  end
end
