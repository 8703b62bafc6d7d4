-- include: now_ms
-- include: emit
-- include: flows
-- include: notify_dependants

-- Delete up to N jobs of one status set, with their job hashes. Called in a loop until
-- it returns 0, so a large queue is purged without blocking Redis for long.
--
-- A purged job's dependants (flows.lua) are resolved as for a parent that is gone
-- ('missing': their policy applies), and its own flow keys go with it.
--
-- KEYS[1] the status set (waiting, scheduled, ready, completed, failed or cancelled), or
--         a concurrency key's parked jobs (keyed_ctx.lua)  ZSET
-- KEYS[2] events     STREAM lifecycle events
-- KEYS[3] job key prefix (job keys are KEYS[3] .. id; same hash tag)
-- KEYS[4..14], ARGV[3..5] the shard's keys and settings for resolving dependants
-- (flow_ctx in flows.lua)
--
-- ARGV[1] most jobs to delete in this call
-- ARGV[2] events stream bounds, `maxlen:max_bytes` (events_cap in emit.lua)
-- ARGV[6] the status of the set's jobs: an id whose record says another (an id reused
--         by a new job while the old one's id waited for its trim) loses only its place
--         in the set, never the new job's record
--
-- Returns the number of ids removed.

local popped = redis.call('ZPOPMIN', KEYS[1], tonumber(ARGV[1]))
local now = now_ms()
local maxlen = events_cap(ARGV[2])
local flow = flow_ctx(4, 3)
for i = 1, #popped, 2 do
  local job_key = KEYS[3] .. popped[i]
  local f = redis.call('HMGET', job_key, 's', 'dc')
  if not f[1] or f[1] == ARGV[6] then
    redis.call('DEL', job_key, job_key .. ':w', job_key .. ':r')
    emit(KEYS[2], maxlen, 'purged', popped[i], now)
    if f[2] then
      notify_dependants(flow, popped[i], 'missing', 'null', now)
    end
    redis.call('DEL', job_key .. ':c')
  end
end
return #popped / 2
