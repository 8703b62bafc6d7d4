-- include: wake_parked

-- Concurrency keys (keyed_ctx.lua): a job leaving the active set frees its slot.

-- A job of `key` left the active set: free its slot and wake the next parked job.
local function free_slot(k, key, ready, marker, job_prefix)
  if tonumber(redis.call('ZINCRBY', k.active, -1, key)) <= 0 then
    redis.call('ZREM', k.active, key)
  end
  wake_parked(k, key, ready, marker, job_prefix)
end
