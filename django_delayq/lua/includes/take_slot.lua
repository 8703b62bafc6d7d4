-- Concurrency keys (keyed_ctx.lua): a claimed job takes a slot of its key or is parked.

-- Take one of `key`'s `limit` slots for a job the claim popped, or park the job (its
-- ready score kept). True if the slot is taken.
local function take_slot(k, key, limit, job_key, job_id, score, seq)
  if (tonumber(redis.call('ZSCORE', k.active, key)) or 0) >= limit then
    redis.call('ZADD', k.park .. key, score, job_id)
    redis.call('ZINCRBY', k.waiting, 1, key)
    redis.call('ZINCRBY', k.waiting, 1, '')  -- '' (no key is empty): the shard's total
    redis.call('HSET', job_key, 'kw', 1)
    return false
  end
  redis.call('ZINCRBY', k.active, 1, key)
  if seq and redis.call('HGET', k.turns, key) == seq then
    redis.call('HDEL', k.turns, key)  -- its last job: the key's turn starts afresh
  end
  return true
end
