-- include: slice

-- Note that waiting jobs of this shard are linked to every parent in another shard
-- (flows.lua): they leave the linking set, which a heartbeat would otherwise repair.
--
-- KEYS[1] linking  ZSET  waiting jobs whose links elsewhere are not yet confirmed
--
-- ARGV    the job ids
--
-- Returns how many ids left the set.

local removed = 0
for first = 1, #ARGV, SLICE do
  local last = math.min(first + SLICE - 1, #ARGV)
  removed = removed + redis.call('ZREM', KEYS[1], unpack(ARGV, first, last))
end
return removed
