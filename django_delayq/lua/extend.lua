-- include: now_ms
-- include: is_leased

-- Extend the leases of running jobs (the worker's heartbeat).
--
-- KEYS[1] active     ZSET  leased job ids by lease deadline (ms)
-- KEYS[2] job key prefix (job keys are KEYS[2] .. id; same hash tag)
--
-- ARGV[1] lease (ms) from now
-- ARGV[2..] per job, 2 values: id, attempt (the lease token)
--
-- Returns {the ids whose lease this worker no longer holds, then per held job whose
-- abort was asked for (cancel.lua) 2 values: its id, who asked}.

local active, job_prefix = KEYS[1], KEYS[2]
local deadline = now_ms() + tonumber(ARGV[1])
local lost, aborting = {}, {}
for i = 2, #ARGV, 2 do
  local job_id = ARGV[i]
  local f = redis.call('HMGET', job_prefix .. job_id, 's', 'n', 'ab')
  if is_leased(f[1]) and f[2] == ARGV[i + 1] and redis.call('ZSCORE', active, job_id) then
    redis.call('ZADD', active, 'XX', deadline, job_id)
    if f[3] then
      aborting[#aborting + 1] = job_id
      aborting[#aborting + 1] = f[3]
    end
  else
    lost[#lost + 1] = job_id
  end
end
return {lost, aborting}
