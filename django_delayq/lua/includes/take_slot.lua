-- include: drop_turn

-- Concurrency keys (keyed_ctx.lua): a claimed job takes a slot of its key or is parked.

-- Take one of `key`'s `limit` slots for a job the claim popped, or park the job (its
-- ready score kept). True if the slot is taken.
local function take_slot(k, key, limit, job_key, job_id, score, seq)
  if (tonumber(redis.call('ZSCORE', k.active, key)) or 0) >= limit then
    -- counted once: a job parked and moved by an older version may still be in the set
    if redis.call('ZADD', k.park .. key, score, job_id) == 1 then
      redis.call('ZINCRBY', k.waiting, 1, key)
      redis.call('ZINCRBY', k.waiting, 1, '')  -- '' (no key is empty): the shard's total
    end
    redis.call('HSET', job_key, 'kw', 1)
    return false
  end
  redis.call('ZINCRBY', k.active, 1, key)
  redis.call('HDEL', job_key, 'kw')  -- set if an older version moved it while parked
  drop_turn(k, key, seq)
  return true
end
