-- Link waiting jobs to their parents in this shard (flows.lua), after enqueue.lua stored
-- them: a parent that has not finished for good records the dependant, to resolve it
-- when it does; a parent that has is reported, for the caller to resolve the dependant
-- now (resolve.lua). Linking twice is harmless (a SET).
--
-- KEYS[1] job key prefix of this shard (parent keys are KEYS[1] .. id)
--
-- ARGV per link, 2 values: parent id, dependant member ('L <index> <id>' for a dependant
--      in this shard, 'R <index> <queue> <shard or -> <id>' elsewhere)
--
-- Returns per link 2 values: 'linked' and '', or the parent's final outcome
-- ('completed', 'failed', 'cancelled'; 'missing' when it is gone) and its result JSON.

local prefix = KEYS[1]
local out = {}
for i = 1, #ARGV, 2 do
  local job_key = prefix .. ARGV[i]
  local f = redis.call('HMGET', job_key, 's', 'v')
  local status = f[1]
  if not status then
    out[#out + 1] = 'missing'
    out[#out + 1] = 'null'
  elseif status == 'completed' or status == 'failed' or status == 'cancelled' then
    out[#out + 1] = status
    out[#out + 1] = f[2] or 'null'
  else
    redis.call('SADD', job_key .. ':c', ARGV[i + 1])
    redis.call('HSET', job_key, 'dc', '1')
    out[#out + 1] = 'linked'
    out[#out + 1] = ''
  end
end
return out
