-- Shared helpers: django_delayq.engine.scripts puts before each script the definitions
-- it uses. Only definitions (and the comments above them) belong here.
--
-- Job HASH fields ({dq:Q}:j:ID) are stored under short names (one listpack holds every
-- name next to its value, and a waiting job is mostly its hash). The table, with the
-- meaning of each field, is django_delayq/engine/fields.py:
--   t task                 a args                 k kwargs (absent: '{}')
--   p priority (absent: 0) s status               r run_at (absent: e)
--   e enqueued_at          m max_attempts (absent: 1)
--   n attempts (absent: 0) q seq                  b started_at
--   f finished_at          w worker               v result
--   x error                tb traceback           g progress (0..1)
--   gm progress message    o time limit, ms (absent: none)
--   h attempt log, JSON (absent: [])
--   d dp dr dc: workflows (parents, policy, results passed, linked), see flows.lua
-- A field shown with a default is not stored while it equals it: read it as
-- `tonumber(x) or default`.

-- The Redis server clock, in milliseconds: the only clock that decides what is due.
local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

-- 2^45: priorities are 2^45 apart in the ready score, so a ready score stays an exact
-- integer in a double ((100 - priority) * 2^45 + seq < 2^53) for 2^45 jobs per queue.
local PRIORITY_STEP = 35184372088832

local function ready_score(priority, seq)
  return (100 - priority) * PRIORITY_STEP + seq
end

-- Append a lifecycle event to the queue's stream (capped, approximate trim).
local function emit(events_key, maxlen, event, job_id, now, ...)
  if maxlen > 0 then
    redis.call('XADD', events_key, 'MAXLEN', '~', maxlen, '*',
      'event', event, 'job', job_id, 'ts', now, ...)
  end
end

-- Values per unpack(): well under the C stack limit of Redis's Lua (8,000).
local SLICE = 1000

-- Run `command key values...` over `values` in slices (ZADD pairs stay whole: SLICE is even).
local function call_sliced(command, key, values)
  for first = 1, #values, SLICE do
    redis.call(command, key, unpack(values, first, math.min(first + SLICE - 1, #values)))
  end
end

-- One event for the jobs `ids`: `job` names a single one, `jobs` several (space-separated;
-- ids hold no spaces), at most SLICE per entry. `attempts` (or nil) holds each job's
-- attempt, written as `attempt` for one job and as `attempts` (in the order of `jobs`)
-- for several; `...` are more fields, the same for every job.
local function emit_jobs(events_key, maxlen, event, ids, now, attempts, ...)
  if maxlen <= 0 or #ids == 0 then
    return
  end
  if #ids == 1 then
    if attempts then
      emit(events_key, maxlen, event, ids[1], now, 'attempt', attempts[1], ...)
    else
      emit(events_key, maxlen, event, ids[1], now, ...)
    end
    return
  end
  for first = 1, #ids, SLICE do
    local last = math.min(first + SLICE - 1, #ids)
    local jobs = table.concat(ids, ' ', first, last)
    if attempts then
      redis.call('XADD', events_key, 'MAXLEN', '~', maxlen, '*', 'event', event, 'jobs', jobs,
        'attempts', table.concat(attempts, ' ', first, last), 'ts', now, ...)
    else
      redis.call('XADD', events_key, 'MAXLEN', '~', maxlen, '*', 'event', event, 'jobs', jobs,
        'ts', now, ...)
    end
  end
end

-- Count a finished job in the per-minute stats hash and in its total since the queue
-- began (field `kind` alone: what the metrics read), and forget minutes over 2 h old.
local function count_minute(stats_key, kind, now, n)
  local minute = math.floor(now / 60000)
  redis.call('HINCRBY', stats_key, kind .. ':' .. minute, n)
  redis.call('HINCRBY', stats_key, kind, n)
  redis.call('HDEL', stats_key, 'c:' .. (minute - 120), 'f:' .. (minute - 120))
end

-- Keep a finished-jobs ZSET to ids younger than ttl_ms and at most keep entries.
local function trim_finished(set_key, now, ttl_ms, keep)
  if ttl_ms > 0 then
    redis.call('ZREMRANGEBYSCORE', set_key, '-inf', '(' .. (now - ttl_ms))
  end
  if keep >= 0 then
    local extra = redis.call('ZCARD', set_key) - keep
    if extra > 0 then
      redis.call('ZREMRANGEBYRANK', set_key, 0, extra - 1)
    end
  end
end

-- Give a finished job hash its time to live; 0 deletes it at once.
local function expire_finished(job_key, ttl_ms)
  if ttl_ms > 0 then
    redis.call('PEXPIRE', job_key, ttl_ms)
  else
    redis.call('DEL', job_key)
  end
end

-- Put a job in the scheduled set and wake an idle worker if it is the new head.
local function schedule_job(scheduled_key, marker_key, job_key, job_id, run_at)
  local head = redis.call('ZRANGE', scheduled_key, 0, 0, 'WITHSCORES')
  redis.call('ZADD', scheduled_key, run_at, job_id)
  redis.call('HSET', job_key, 's', 'scheduled', 'r', run_at)
  if head[2] == nil or run_at < tonumber(head[2]) then
    redis.call('ZADD', marker_key, run_at, '1')
  end
end

-- Moving jobs to ready, the one way every script does it: each job's hash is marked
-- ready (mark_ready; enqueue writes the same fields in its one HSET of a new job), and
-- its (ready score, id) pair is collected so the ready set gets them in few ZADDs
-- (add_ready), which also wakes an idle worker when given the marker key.

-- Mark a job hash ready; `seq`, when given, is its new FIFO number (else it keeps its own).
local function mark_ready(job_key, seq)
  if seq then
    redis.call('HSET', job_key, 's', 'ready', 'q', seq)
  else
    redis.call('HSET', job_key, 's', 'ready')
  end
end

-- Add `scored_ids` ((ready score, id) pairs) to the ready set; with `marker_key`, wake
-- an idle worker (the caller may hold the wake-up back, as a claim does while its
-- window is full).
local function add_ready(ready_key, scored_ids, marker_key)
  if #scored_ids == 0 then
    return
  end
  call_sliced('ZADD', ready_key, scored_ids)
  if marker_key then
    redis.call('ZADD', marker_key, 0, '0')
  end
end

-- Make one job ready with a fresh FIFO sequence number and wake an idle worker.
local function ready_job(ready_key, seq_key, marker_key, job_key, job_id, priority)
  local seq = redis.call('INCR', seq_key)
  mark_ready(job_key, seq)
  add_ready(ready_key, {ready_score(priority, seq), job_id}, marker_key)
end

-- Place a job by its run_at: ready when due, scheduled otherwise. Returns the status.
local function place_job(k, job_key, job_id, priority, run_at, now)
  if run_at <= now then
    ready_job(k.ready, k.seq, k.marker, job_key, job_id, priority)
    redis.call('HSET', job_key, 'r', run_at)
    return 'ready'
  end
  schedule_job(k.scheduled, k.marker, job_key, job_id, run_at)
  return 'scheduled'
end

-- The run_at asked for: an absolute time, a delay from now, or now.
local function wanted_run_at(run_at_arg, delay_arg, now)
  if run_at_arg ~= '' then
    return tonumber(run_at_arg)
  end
  if delay_arg ~= '' then
    return now + tonumber(delay_arg)
  end
  return now
end

-- Start-rate window (a sliding log): the ZSET holds one entry per start in the last
-- period ms, scored by its start time. Forget starts that left the window and return
-- how many more may start now.
local function limit_room(limit_key, limit, period, now)
  redis.call('ZREMRANGEBYSCORE', limit_key, '-inf', now - period)
  return math.max(0, limit - redis.call('ZCARD', limit_key))
end

-- When the next start may happen (ms), once the window is full.
local function limit_next_slot(limit_key, limit, period, now)
  local used = redis.call('ZCARD', limit_key)
  if used < limit then
    return now
  end
  local entry = redis.call('ZRANGE', limit_key, used - limit, used - limit, 'WITHSCORES')
  return tonumber(entry[2]) + period
end

-- Count one start in the window.
local function limit_take(limit_key, period, now, member)
  redis.call('ZADD', limit_key, now, member)
  redis.call('PEXPIRE', limit_key, period + 1000)
end

-- Upper bounds (ms) of the duration and start-lateness histograms kept in the stats
-- hash; django_delayq/engine/stats.py repeats them. Bucket i counts values in
-- (bound i-1, bound i]; bucket #HISTOGRAM_MS + 1 counts the rest.
local HISTOGRAM_MS = {5, 10, 25, 50, 100, 250, 500, 1000, 2500, 5000, 10000, 30000, 60000,
  300000}

-- Add `values` (ms) to the histogram `name` of the stats hash: field `name:i` per
-- bucket, `name:sum` the sum. One HINCRBY per bucket the call's values fall in, and one
-- for the sum: a call's jobs usually share one or two buckets.
local function observe(stats_key, name, values)
  if #values == 0 then
    return
  end
  local counts, sum = {}, 0
  for _, v in ipairs(values) do
    if v < 0 then
      v = 0
    end
    local b = #HISTOGRAM_MS + 1
    for i = 1, #HISTOGRAM_MS do
      if v <= HISTOGRAM_MS[i] then
        b = i
        break
      end
    end
    counts[b] = (counts[b] or 0) + 1
    sum = sum + v
  end
  for b, c in pairs(counts) do
    redis.call('HINCRBY', stats_key, name .. ':' .. b, c)
  end
  redis.call('HINCRBY', stats_key, name .. ':sum', sum)
end

-- Whether a job's status says it is leased: claimed (waiting in a worker's buffer) or
-- active (a worker's thread runs it).
local function is_leased(status)
  return status == 'active' or status == 'claimed'
end

-- The last `n` bytes of `s` at most, starting at a character's first byte (a UTF-8
-- character is never cut in two).
local function utf8_tail(s, n)
  if #s <= n then
    return s
  end
  local i = #s - n + 1
  while i <= #s do
    local b = string.byte(s, i)
    if b < 128 or b >= 192 then
      break
    end
    i = i + 1
  end
  return string.sub(s, i)
end

-- Append one attempt to the job's attempt log (field h, a JSON array, oldest first),
-- keeping the last 25 (django_delayq/engine/fields.py describes the entries). A failed
-- attempt keeps the end of its traceback, `tb` (its last ATTEMPT_TRACEBACK bytes: the
-- frames nearest the error and the error itself).
local ATTEMPT_LOG_SIZE = 25
local ATTEMPT_TRACEBACK = 2000
local function log_attempt(job_key, attempt, worker, started, finished, outcome, err, tb)
  local log = {}
  local raw = redis.call('HGET', job_key, 'h')
  if raw then
    local ok, decoded = pcall(cjson.decode, raw)
    if ok and type(decoded) == 'table' then
      log = decoded
    end
  end
  local entry = {n = tonumber(attempt) or 0, w = worker or '', b = tonumber(started) or 0,
                 f = finished, o = outcome}
  if err and err ~= '' then
    entry.x = string.sub(err, 1, 500)
  end
  if tb and tb ~= '' then
    entry.t = utf8_tail(tb, ATTEMPT_TRACEBACK)
  end
  log[#log + 1] = entry
  while #log > ATTEMPT_LOG_SIZE do
    table.remove(log, 1)
  end
  redis.call('HSET', job_key, 'h', cjson.encode(log))
end
