-- Start-rate window (a sliding log): the ZSET holds one entry per start in the last
-- period ms, scored by its start time.

-- Forget starts that left the window and return how many more may start now.
local function limit_room(limit_key, limit, period, now)
  redis.call('ZREMRANGEBYSCORE', limit_key, '-inf', now - period)
  return math.max(0, limit - redis.call('ZCARD', limit_key))
end

-- When the next start may happen (ms), once the window is full.
local function limit_next_slot(limit_key, limit, period, now)
  local used = redis.call('ZCARD', limit_key)
  if used < limit then
    return now
  end
  local entry = redis.call('ZRANGE', limit_key, used - limit, used - limit, 'WITHSCORES')
  return (tonumber(entry[2]) or now) + period
end

-- Count one start in the window.
local function limit_take(limit_key, period, now, member)
  redis.call('ZADD', limit_key, now, member)
  redis.call('PEXPIRE', limit_key, period + 1000)
end
