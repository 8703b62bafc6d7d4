-- Moving jobs to ready, the one way every script does it: each job's hash is marked
-- ready (mark_ready; enqueue writes the same fields in its one HSET of a new job), and
-- its (ready score, id) pair is collected so the ready set gets them in few ZADDs
-- (add_ready.lua), which also wakes an idle worker when given the marker key.

-- Mark a job hash ready; `seq`, when given, is its new FIFO number (else it keeps its own).
local function mark_ready(job_key, seq)
  if seq then
    redis.call('HSET', job_key, 's', 'ready', 'q', seq)
  else
    redis.call('HSET', job_key, 's', 'ready')
  end
end
