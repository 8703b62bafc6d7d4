-- Count a finished job in the per-minute stats hash and in its total since the queue
-- began (field `kind` alone: what the metrics read), and forget minutes over 2 h old.
local function count_minute(stats_key, kind, now, n)
  local minute = math.floor(now / 60000)
  redis.call('HINCRBY', stats_key, kind .. ':' .. minute, n)
  redis.call('HINCRBY', stats_key, kind, n)
  redis.call('HDEL', stats_key, 'c:' .. (minute - 120), 'f:' .. (minute - 120))
end
