-- include: minutes_kept

-- Count a finished job in the per-minute stats hash and in its total since the queue
-- began (field `kind` alone: what the metrics read), and forget minutes over 2 h old.
-- It deletes only the minute exactly MINUTES_KEPT back, so a minute with none counted
-- MINUTES_KEPT later (a queue busy now and then) stays: counters.lua, which reads every
-- field anyway, drops those.
local function count_minute(stats_key, kind, now, n)
  local minute = math.floor(now / 60000)
  redis.call('HINCRBY', stats_key, kind .. ':' .. minute, n)
  redis.call('HINCRBY', stats_key, kind, n)
  redis.call('HDEL', stats_key, 'c:' .. (minute - MINUTES_KEPT),
    'f:' .. (minute - MINUTES_KEPT))
end
