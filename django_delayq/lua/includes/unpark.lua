-- include: wake_parked

-- Concurrency keys (keyed_ctx.lua): a parked job cancelled or moved.

-- Take a parked job out of its key's park set, as a cancel or a move does: it waits
-- for no slot now, and neither the key's waiting count nor a purge of the parked jobs
-- (which deletes what the set holds) may count it.
local function unpark(k, key, job_key, job_id)
  if redis.call('ZREM', k.park .. key, job_id) == 1 then
    count_unparked(k, key)
  end
  redis.call('HDEL', job_key, 'kw')
end
