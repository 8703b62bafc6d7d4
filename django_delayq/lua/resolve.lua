-- include: now_ms
-- include: flows
-- include: notify_dependants

-- Resolve parents of waiting jobs of this shard (flows.lua): what a parent's outbox
-- entry (or a link that found the parent finished) says. Idempotent: a resolution
-- already applied, or a job no longer waiting, changes nothing.
--
-- KEYS[1..11], ARGV[1..3] the shard's keys and settings (flow_ctx in flows.lua)
--
-- ARGV[4..] per resolution, 5 values: dependant id, parent index, the parent's outcome
--           ('completed', 'failed', 'cancelled', 'missing'), parent id, its result JSON
--
-- Returns the outbox entries pushed for dependants of jobs finished here by their policy.

local flow = flow_ctx(1, 1)
local now = now_ms()
local pushed = 0
for i = 4, #ARGV, 5 do
  local job_id = ARGV[i]
  local ended = resolve_dependant(flow, job_id, ARGV[i + 1], ARGV[i + 2], ARGV[i + 4],
    ARGV[i + 3], now)
  if ended and redis.call('HGET', flow.prefix .. job_id, 'dc') then
    pushed = pushed + notify_dependants(flow, job_id, ended, 'null', now)
  end
end
trim_finished_waiting(flow, now)
return pushed
