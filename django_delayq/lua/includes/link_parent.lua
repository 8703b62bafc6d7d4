-- Link the dependant `member` (<job key>:c in flows.lua) to the parent `parent_id` of this
-- shard. Returns nil once linked, or the parent's final outcome ('completed', 'failed',
-- 'cancelled'; 'missing' when it is gone) and its result JSON, for the caller to resolve.
local function link_parent(prefix, parent_id, member)
  local job_key = prefix .. parent_id
  local f = redis.call('HMGET', job_key, 's', 'v')
  local status = f[1]
  if not status then
    return 'missing', 'null'
  end
  if status == 'completed' or status == 'failed' or status == 'cancelled' then
    return status, f[2] or 'null'
  end
  redis.call('SADD', job_key .. ':c', member)
  redis.call('HSET', job_key, 'dc', '1')
  return nil
end
