-- Concurrency keys (keyed_ctx.lua): a parked job made ready again, to be claimed.

-- Count one parked job of `key` gone from its park set: the key's and the shard's total.
local function count_unparked(k, key)
  for _, member in ipairs({key, ''}) do
    if tonumber(redis.call('ZINCRBY', k.waiting, -1, member)) <= 0 then
      redis.call('ZREM', k.waiting, member)
    end
  end
end

-- Make the key's oldest parked job that is still ready (one an older version left in the
-- set when it was cancelled or moved is skipped) ready again, at its old place: the next
-- claim gives it a slot, or parks it again while the key is at its limit.
local function wake_parked(k, key, ready, marker, job_prefix)
  local park = k.park .. key
  while true do
    local head = redis.call('ZPOPMIN', park)
    if not head[1] then
      return
    end
    count_unparked(k, key)
    local job_key = job_prefix .. head[1]
    if redis.call('HGET', job_key, 's') == 'ready' then
      redis.call('HDEL', job_key, 'kw')
      redis.call('ZADD', ready, head[2], head[1])
      redis.call('ZADD', marker, 0, '0')
      return
    end
  end
end
