-- include: now_ms_us
-- include: ready_score
-- include: turn
-- include: emit
-- include: call_sliced
-- include: emit_jobs
-- include: mark_ready
-- include: add_ready
-- include: rate_limit
-- include: keyed_ctx
-- include: fair_turn
-- include: take_slot
-- include: schedule_job
-- include: count_minute

-- Claim a batch: promote due scheduled jobs, pop ready jobs by priority then FIFO, and
-- lease them to a worker: 'claimed', until the worker says a thread started it (start.lua).
-- Nothing is claimed while the queue is paused, and no more
-- jobs start than the queue's start-rate window allows. A job whose concurrency key is
-- at its limit is parked and the claim goes on with the next (lua/includes/keyed_ctx.lua).
--
-- KEYS[1] scheduled  ZSET  job ids by run_at (ms)
-- KEYS[2] ready      ZSET  job ids by ready score
-- KEYS[3] active     ZSET  leased job ids by lease deadline (ms)
-- KEYS[4] marker     ZSET  wake-up marks for idle workers
-- KEYS[5] events     STREAM lifecycle events
-- KEYS[6] seq        STRING FIFO counter
-- KEYS[7] paused     STRING present while the queue is paused
-- KEYS[8] job key prefix (job keys are KEYS[8] .. id; same hash tag)
-- KEYS[9] limit      ZSET  start times in the current window (the queue's one window,
--                          shared by its shards; unused when ARGV[6] is 0)
-- KEYS[10] failed    ZSET  dead-lettered job ids (a job key that is not a hash goes here)
-- KEYS[11] stats     HASH  the failed totals a damaged job key adds to (a claim is no
--                          start: start.lua counts the starts)
-- KEYS[12..16] the shard's concurrency-key keys (keyed_ctx.lua)
--
-- ARGV[1] most jobs to claim
-- ARGV[2] lease (ms)
-- ARGV[3] worker id
-- ARGV[4] most scheduled jobs to promote in this call
-- ARGV[5] events stream bounds, `maxlen:max_bytes` (events_cap in emit.lua)
-- ARGV[6] most starts per window (0: no limit here)
-- ARGV[7] window length (ms)
--
-- Returns {now ms, next due run_at ms (-1: none scheduled), paused (0/1),
--          orphan ids dropped (ids with no job hash), ms until the window lets the
--          next job start (-1: not limited), µs from now until the next due run_at
--          (-1: none scheduled), then per claimed job 11 values:
--          id, task, args, kwargs, attempt, max_attempts, priority, run_at, enqueued_at,
--          time limit ms (0: none), W3C traceparent ('' for none)}

local scheduled, ready, active, marker = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local events, seq_key, job_prefix = KEYS[5], KEYS[6], KEYS[8]
local want, lease, worker = tonumber(ARGV[1]), tonumber(ARGV[2]), ARGV[3]
local promote_max, maxlen = tonumber(ARGV[4]), events_cap(ARGV[5])
local limit_key, limit, period = KEYS[9], tonumber(ARGV[6]) or 0, tonumber(ARGV[7]) or 0
local failed_key = KEYS[10]
local kc = keyed_ctx(12)
local now, past_ms_us = now_ms_us()
local orphans = 0

-- A job key that is not a hash (written by hand) cannot be run or read: replace it with
-- a failed job saying what was found, rather than raising half way through the claim
-- (which would leave its id in no set at all).
local function fail_damaged(job_key, job_id, found)
  local kind = redis.call('TYPE', job_key)['ok']
  local reason = 'DamagedJob: the job key held a ' .. kind .. ', not a hash (' ..
    string.sub(tostring(found), 1, 120) .. ')'
  redis.call('DEL', job_key)
  redis.call('HSET', job_key, 't', '', 's', 'failed', 'x', reason, 'e', now, 'f', now)
  redis.call('ZADD', failed_key, now, job_id)
  count_minute(KEYS[11], 'f', now, 1)  -- dead-lettered, as fail.lua counts
  emit(events, maxlen, 'failed', job_id, now, 'error', reason)
end

-- Promote due jobs in run_at order; each gets a fresh FIFO number as it becomes ready,
-- and one 'promoted' event names them all (the mirror's rows leave 'scheduled').
local due = redis.call('ZRANGEBYSCORE', scheduled, '-inf', now, 'LIMIT', 0, promote_max)
if #due > 0 then
  local seq = redis.call('INCRBY', seq_key, #due * TURN) - #due * TURN
  local promoted, to_ready, floors = {}, {}, {}
  call_sliced('ZREM', scheduled, due)
  for i = 1, #due do
    local job_id = due[i]
    local job_key = job_prefix .. job_id
    local f = redis.pcall('HMGET', job_key, 't', 'p', 'ck', 'cw')
    -- A damaged hash (no task, a bad priority) is promoted too: the worker fails it
    -- with a clear error, and it cannot stop the promotion of every other job.
    if f['err'] then
      fail_damaged(job_key, job_id, f['err'])
    elseif f[1] or redis.call('EXISTS', job_key) == 1 then
      local priority, turn = tonumber(f[2]) or 0, seq + i * TURN
      if f[3] then
        turn = fair_turn(kc.turns, ready, seq_key, f[3], priority, floors, tonumber(f[4]) or 1)
      end
      mark_ready(job_key, turn)
      to_ready[#to_ready + 1] = ready_score(priority, turn)
      to_ready[#to_ready + 1] = job_id
      promoted[#promoted + 1] = job_id
    else
      orphans = orphans + 1
      emit(events, maxlen, 'orphaned', job_id, now)
    end
  end
  add_ready(ready, to_ready)  -- the wake-up, if any, comes after the claim
  emit_jobs(events, maxlen, 'promoted', promoted, now)
end

local head = redis.call('ZRANGE', scheduled, 0, 0, 'WITHSCORES')
local next_due, due_in_us = -1, -1
if head[2] then
  next_due = tonumber(head[2])
  due_in_us = math.max(0, (next_due - now) * 1000 - past_ms_us)
end

if redis.call('EXISTS', KEYS[7]) == 1 then
  return {now, next_due, 1, orphans, -1, due_in_us}
end

if limit > 0 and want > 0 then
  want = math.min(want, limit_room(limit_key, limit, period, now))
end

local out = {now, next_due, 0, orphans, -1, due_in_us}
if want > 0 then
  local deadline = now + lease
  local leases, started, attempts = {}, {}, {}
  -- Parked jobs take no slot of the batch: pop again (a few rounds at most) to fill it.
  local rounds = 0
  while #started < want and rounds < 8 do
    rounds = rounds + 1
    local popped = redis.call('ZPOPMIN', ready, want - #started)
    if #popped == 0 then
      break
    end
    for i = 1, #popped, 2 do
      local job_id = popped[i]
      local job_key = job_prefix .. job_id
      local f = redis.pcall('HMGET', job_key, 't', 'a', 'k', 'm', 'p', 'r', 'e', 'n', 'o',
        'ck', 'cl', 'q', 'tp', 'kr', 'kp')
      -- a key's rate and limit as stored; a damaged one (0, negative) is no rate and a
      -- limit of 1, never an error that would leave this batch half claimed
      local kr, kp = math.floor(tonumber(f[14]) or 0), math.floor(tonumber(f[15]) or 0)
      local rate_key = f[10] and kr >= 1 and kp >= 1 and kc.rate .. f[10]
      if f['err'] then
        fail_damaged(job_key, job_id, f['err'])
      elseif not (f[1] or redis.call('EXISTS', job_key) == 1) then
        orphans = orphans + 1
        emit(events, maxlen, 'orphaned', job_id, now)
      elseif rate_key and limit_room(rate_key, kr, kp, now) == 0 then
        -- the key's window is full: back to scheduled for its next start
        local at = limit_next_slot(rate_key, kr, kp, now)
        schedule_job(scheduled, marker, job_key, job_id, at)
        emit(events, maxlen, 'rescheduled', job_id, now, 'run_at', at)
        if out[2] == -1 or at < out[2] then
          out[2] = at
        end
      elseif not f[10] or take_slot(kc, f[10], math.max(1, tonumber(f[11]) or 1), job_key, job_id,
          popped[i + 1], f[12]) then
        -- A damaged hash is leased and returned like any other (missing text as '',
        -- bad numbers as defaults) so the worker fails it with a clear error; raising
        -- here would leave this batch half-claimed and stall the queue on one job.
        local attempt = (tonumber(f[8]) or 0) + 1
        redis.call('HSET', job_key, 'n', attempt, 's', 'claimed', 'w', worker)
        redis.call('HDEL', job_key, 'b')  -- not started yet (a retry's holds the last start)
        leases[#leases + 1] = deadline
        leases[#leases + 1] = job_id
        started[#started + 1] = job_id
        attempts[#attempts + 1] = attempt
        if limit > 0 then
          limit_take(limit_key, period, now, job_id .. '@' .. now)
        end
        if rate_key then
          limit_take(rate_key, kp, now, job_id .. '@' .. now)
        end
        out[#out + 1] = job_id
        out[#out + 1] = f[1] or ''
        out[#out + 1] = f[2] or ''
        out[#out + 1] = f[3] or '{}'
        out[#out + 1] = attempt
        out[#out + 1] = tonumber(f[4]) or 1
        out[#out + 1] = tonumber(f[5]) or 0
        out[#out + 1] = tonumber(f[6] or f[7]) or now
        out[#out + 1] = tonumber(f[7]) or now
        out[#out + 1] = tonumber(f[9]) or 0
        out[#out + 1] = f[13] or ''
      end
    end
  end
  call_sliced('ZADD', active, leases)
  emit_jobs(events, maxlen, 'claimed', started, now, attempts, 'worker', worker)
  out[4] = orphans
end

-- Work left behind: wake another idle worker for it, unless the window is full; then
-- say when it opens, so workers sleep until then instead of asking again.
if redis.call('ZCARD', ready) > 0 then
  if limit > 0 and limit_room(limit_key, limit, period, now) == 0 then
    out[5] = limit_next_slot(limit_key, limit, period, now) - now
  else
    redis.call('ZADD', marker, 0, '0')
  end
end
return out
