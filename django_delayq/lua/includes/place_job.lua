-- include: schedule_job
-- include: ready_job

-- Place a job by its run_at: ready when due, scheduled otherwise. Returns the status.
-- `k` holds the shard's keys (flow_ctx in flows.lua, or a table with the same names).
local function place_job(k, job_key, job_id, priority, run_at, now)
  if run_at <= now then
    ready_job(k.ready, k.seq, k.marker, job_key, job_id, priority)
    redis.call('HSET', job_key, 'r', run_at)
    return 'ready'
  end
  schedule_job(k.scheduled, k.marker, job_key, job_id, run_at)
  return 'scheduled'
end
