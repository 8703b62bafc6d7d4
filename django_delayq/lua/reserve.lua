-- include: now_ms
-- include: rate_limit

-- Reserve starts in a queue's start-rate window before claiming from its shards, when
-- the shards live in other Redis Cluster slots than the window (a script cannot touch
-- two slots). The caller claims at most the granted count, then gives back (ZREM) the
-- tokens it did not use.
--
-- KEYS[1] limit  ZSET  start times in the current window
--
-- ARGV[1] starts wanted
-- ARGV[2] most starts per window
-- ARGV[3] window length (ms)
-- ARGV[4] token prefix: the i-th granted start is recorded as '<prefix>:<i>'
--
-- Returns {granted, ms until the window lets the next start happen (-1: room left)}.

local limit_key = KEYS[1]
local want, limit, period = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local now = now_ms()
local granted = math.min(want, limit_room(limit_key, limit, period, now))
for i = 1, granted do
  limit_take(limit_key, period, now, ARGV[4] .. ':' .. i)
end
local wait = -1
if limit_room(limit_key, limit, period, now) == 0 then
  wait = limit_next_slot(limit_key, limit, period, now) - now
end
return {granted, wait}
