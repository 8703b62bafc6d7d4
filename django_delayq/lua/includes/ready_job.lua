-- include: ready_score
-- include: turn
-- include: mark_ready
-- include: add_ready

-- Make one job ready with a fresh FIFO sequence number and wake an idle worker.
local function ready_job(ready_key, seq_key, marker_key, job_key, job_id, priority)
  local seq = redis.call('INCRBY', seq_key, TURN)
  mark_ready(job_key, seq)
  add_ready(ready_key, {ready_score(priority, seq), job_id}, marker_key)
end
