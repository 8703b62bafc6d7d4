-- Concurrency keys (keyed_ctx.lua): a parked job made ready again, to be claimed.

-- Make the key's oldest parked job that is still ready (a parked job may have been
-- cancelled) ready again, at its old place: the next claim gives it a slot, or parks it
-- again while the key is at its limit.
local function wake_parked(k, key, ready, marker, job_prefix)
  local park = k.park .. key
  while true do
    local head = redis.call('ZPOPMIN', park)
    if not head[1] then
      return
    end
    for _, member in ipairs({key, ''}) do  -- the key's count and the shard's total
      if tonumber(redis.call('ZINCRBY', k.waiting, -1, member)) <= 0 then
        redis.call('ZREM', k.waiting, member)
      end
    end
    local job_key = job_prefix .. head[1]
    if redis.call('HGET', job_key, 's') == 'ready' then
      redis.call('HDEL', job_key, 'kw')
      redis.call('ZADD', ready, head[2], head[1])
      redis.call('ZADD', marker, 0, '0')
      return
    end
  end
end
