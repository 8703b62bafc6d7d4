-- include: emit
-- include: slice
-- include: trim_finished
-- include: place_job
-- include: count_minute

-- Workflows: jobs that wait for other jobs (django_delayq/engine/flows.py, docs/workflows.md).
--
-- A waiting job (status 'waiting', in its queue's waiting ZSET by enqueued_at) holds:
--   d   its parents, JSON [[queue, id], ...] in the order given
--   dp  its policy when a parent fails for good or is cancelled: 'run' or 'fail'
--       (absent: 'cancel')
--   dr  what it receives of its parents' results: 'one' (the first parent's result as its
--       first argument) or 'all' (the list of every parent's result, in order, first)
--   <job key>:w  SET   the indexes (1-based, into d) of the parents not yet resolved
--   <job key>:r  HASH  index -> result JSON of the parents resolved (only with dr)
-- A parent holds:
--   dc  '1' once a dependant was linked to it
--   <job key>:c  SET  its dependants: 'L <index> <id>' in its own queue shard, or
--                     'R <index> <queue> <shard or -> <id>' elsewhere; it expires with
--                     the parent's hash
--
-- Linking (a dependant to one parent) runs in the parent's shard: in enqueue.lua itself
-- for a parent of the dependant's own shard, in link.lua for one elsewhere. A dependant
-- with parents elsewhere stays in its shard's linking ZSET (by enqueue time) until its
-- producer confirms those links (linked.lua); one still there after a grace period is
-- handed to one worker's heartbeat (reclaim.lua), which links it again (its producer
-- died or lost Redis between the two steps). Linking (link_parent.lua) twice is harmless:
-- the parent's dependants are a SET.
--
-- Resolving (parent index i of a waiting job) is an SREM of i from the job's :w set:
-- applying it twice changes nothing, so every path below may be retried. When the set
-- empties the job is placed by its own run_at (ready when due). A dependant in another
-- shard (another Cluster slot) cannot be touched here: its resolution is pushed, in the
-- same script as the parent's finish (notify_dependants.lua), to this shard's outbox
-- LIST, which workers apply with resolve.lua in the dependant's shard and only then
-- remove (at-least-once delivery of an idempotent step: nothing lost, nothing applied
-- twice).

-- The keys and settings of one shard that resolving needs: KEYS[kf..kf+10], ARGV[af..af+2]
-- (engine/commands.py `_flow_call` builds them).
local function flow_ctx(kf, af)
  return {scheduled = KEYS[kf], ready = KEYS[kf + 1], marker = KEYS[kf + 2],
          seq = KEYS[kf + 3], cancelled = KEYS[kf + 4], failed = KEYS[kf + 5],
          outbox = KEYS[kf + 6], waiting = KEYS[kf + 7], events = KEYS[kf + 8],
          prefix = KEYS[kf + 9], stats = KEYS[kf + 10], ttl = tonumber(ARGV[af]),
          keep = tonumber(ARGV[af + 1]), maxlen = events_cap(ARGV[af + 2])}
end

-- Finish a waiting job for good ('cancelled' or 'failed'): its policy after a parent's
-- failure or cancellation. Its set is trimmed later (trim_finished_waiting), once its
-- own dependants were read: a trim may drop the job, and its set of dependants with it.
-- A job failed here is dead-lettered as fail.lua's are, so it counts in the same total.
local function finish_waiting(k, job_id, status, err, now)
  local job_key = k.prefix .. job_id
  local set = status == 'failed' and k.failed or k.cancelled
  redis.call('ZREM', k.waiting, job_id)
  redis.call('DEL', job_key .. ':w', job_key .. ':r')
  redis.call('HSET', job_key, 's', status, 'x', err, 'f', now)
  redis.call('ZADD', set, now, job_id)
  if k.ttl > 0 then
    redis.call('PEXPIRE', job_key, k.ttl)
  end
  if status == 'failed' then
    count_minute(k.stats, 'f', now, 1)
  end
  k['trim_' .. status] = true
  emit(k.events, k.maxlen, status, job_id, now, 'error', err)
end

-- Trim the sets finish_waiting added to (in a fixed order: a script's writes are the
-- same on every replica).
local function trim_finished_waiting(k, now)
  if k.trim_failed then
    trim_finished(k.failed, k.prefix, now, k.ttl, k.keep)
    k.trim_failed = nil
  end
  if k.trim_cancelled then
    trim_finished(k.cancelled, k.prefix, now, k.ttl, k.keep)
    k.trim_cancelled = nil
  end
end

-- Release a waiting job whose parents are all resolved: its arguments take the parents'
-- results (dr), then it is placed by its own run_at, or now when that has passed: a job
-- is due from its release, so its start lateness (start - run_at) does not count the wait
-- for its parents.
local function release_waiting(k, job_id, now)
  local job_key = k.prefix .. job_id
  local f = redis.call('HMGET', job_key, 'p', 'r', 'e', 'a', 'dr', 'd')
  if f[5] then
    local n = #cjson.decode(f[6])
    local vals = {}
    for first = 1, n, SLICE do
      local fields = {}
      for i = first, math.min(first + SLICE - 1, n) do
        fields[#fields + 1] = i
      end
      local got = redis.call('HMGET', job_key .. ':r', unpack(fields))
      for j = 1, #fields do
        vals[#vals + 1] = got[j] or 'null'
      end
    end
    local head = f[5] == 'one' and (vals[1] or 'null') or '[' .. table.concat(vals, ',') .. ']'
    local args = f[4] or '[]'
    if args == '[]' then
      args = '[' .. head .. ']'
    else
      args = '[' .. head .. ',' .. string.sub(args, 2)
    end
    redis.call('HSET', job_key, 'a', args)
  end
  redis.call('DEL', job_key .. ':w', job_key .. ':r')
  redis.call('ZREM', k.waiting, job_id)
  local run_at = math.max(tonumber(f[2] or f[3]) or now, now)
  local status = place_job(k, job_key, job_id, tonumber(f[1]) or 0, run_at, now)
  emit(k.events, k.maxlen, 'unblocked', job_id, now, 'status', status, 'run_at', run_at)
end

-- Resolve parent `index` of the waiting job `job_id` of this shard: the parent
-- `parent_id` ended with `outcome` ('completed', 'failed', 'cancelled' or 'missing') and
-- `result` (JSON). Returns the status the job was finished with by its policy, or nil.
local function resolve_dependant(k, job_id, index, outcome, result, parent_id, now)
  local job_key = k.prefix .. job_id
  if redis.call('HGET', job_key, 's') ~= 'waiting' then
    return nil
  end
  if redis.call('SREM', job_key .. ':w', index) == 0 then
    return nil
  end
  local f = redis.call('HMGET', job_key, 'dp', 'dr')
  if outcome ~= 'completed' then
    if f[1] ~= 'run' then
      local status = f[1] == 'fail' and 'failed' or 'cancelled'
      finish_waiting(k, job_id, status, 'DependencyFailed: parent ' .. parent_id .. ' '
        .. outcome, now)
      return status
    end
    result = 'null'
  end
  if f[2] then
    redis.call('HSET', job_key .. ':r', index, result)
  end
  if redis.call('SCARD', job_key .. ':w') == 0 then
    release_waiting(k, job_id, now)
  end
  return nil
end
