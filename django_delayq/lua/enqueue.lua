-- include: now_ms
-- include: ready_score
-- include: turn
-- include: slice
-- include: call_sliced
-- include: emit
-- include: emit_jobs
-- include: add_ready
-- include: wanted_run_at
-- include: flows
-- include: link_parent
-- include: fair_turn

-- Enqueue jobs, skipping every job whose id already exists (dedupe while the job exists).
-- A job hash's fields have short names: django_delayq/engine/fields.py is their table.
--
-- KEYS[1] scheduled  ZSET  job ids by run_at (ms)
-- KEYS[2] ready      ZSET  job ids by ready score
-- KEYS[3] marker     ZSET  wake-up marks for idle workers
-- KEYS[4] events     STREAM lifecycle events
-- KEYS[5] seq        STRING FIFO counter
-- KEYS[6..5+n]       HASH  one job key per job, in ARGV order
-- KEYS[6+n] stats    HASH  the enqueued total (field 'e'), duplicates skipped ('du')
-- with f > 0 (keyed jobs, below), last:
-- KEYS[#KEYS-2] turns HASH concurrency key -> its last FIFO number (keyed_ctx.lua)
-- KEYS[#KEYS-1] the dedupe record prefix (STRING <prefix><dedupe key>: a job id)
-- KEYS[#KEYS]   the job key prefix (of the job a dedupe record names)
-- with m > 0 (jobs that wait, below):
-- KEYS[7+n..17+n], the shard's keys for resolving dependants (flow_ctx in flows.lua; its
--                  waiting ZSET gets the jobs that wait, by enqueued time, ms)
-- KEYS[18+n] linking ZSET  waiting jobs whose links to parents in other shards are not
--                          yet confirmed, by enqueued time (ms)
--
-- ARGV[1] events stream bounds, `maxlen:max_bytes` (events_cap in emit.lua)
-- ARGV[2] m: how many of the jobs wait for parents
-- ARGV[3] f: how many of the jobs have a concurrency or dedupe key
-- ARGV[4..3+10n] per job, 10 values: id, task, args JSON, kwargs JSON, priority,
--           run_at ms ('' for none), delay ms ('' for none), max attempts,
--           time limit ms ('' for none), W3C traceparent ('' for none)
-- then per waiting job, 5 values: its index among the jobs (1-based), its parents JSON
--           ([[queue, id], ...]), its policy ('' cancel, 'run', 'fail'), what it
--           receives of their results ('' nothing, 'one', 'all'), and the indexes
--           (1-based, space-separated) of its parents in this shard; see flows.lua.
-- then, with m > 0, the 3 settings for resolving dependants (flow_ctx in flows.lua).
-- then per keyed job, 9 values: its index among the jobs (1-based), its concurrency key
--           ('' for none), that key's limit, its dedupe key ('' for none), the dedupe
--           mode ('throttle', 'debounce', 'keep_last'), the mode's window (ms), the key's
--           starts allowed per period (0: no rate), that period (ms) and the weight of
--           its turns (1..16; fair_turn.lua).
--
-- A keyed job is stored with its key ('ck'), limit ('cl') and a weight other than 1
-- ('cw'); one that is ready at once
-- takes its key's next fair turn as its FIFO number (fair_turn.lua). A dedupe
-- key names the job that stands for it (a record with a time to live): 'throttle'
-- ignores the job while the record lives (the window); 'debounce' replaces the arguments
-- of the job it names while that one is scheduled, and moves its run_at to this job's;
-- 'keep_last' replaces the arguments of the one it names while that one has not started.
-- Else the job is added and the record names it. A call may hold several jobs with a
-- dedupe mode, of one key or of several: each sees what the ones before it did (a job
-- this call added may be replaced or ignored by the next).
--
-- A job that waits is stored 'waiting' (its run_at kept) and linked, in this call, to
-- its parents of this shard; a parent already finished resolves it at once. A job with
-- parents in other shards joins the linking set: the caller links those next (link.lua)
-- and then confirms (linked.lua); if it never does, a heartbeat links them again.
--
-- Returns, per job, 4 values: added (1, or 0 for a duplicate), status (after linking:
-- a job whose parents here had all finished is already ready, scheduled or ended by its
-- policy), run_at ms, enqueued_at ms (of the existing job for a duplicate); with a dedupe
-- mode, added is 1 (created), 2 (replaced: the job named by the record got these
-- arguments) or 3 (ignored). Then, per job with a dedupe mode in call order, one value:
-- the id of the job in effect ('' for a job whose id existed).
--
-- Loaded twice (engine/scripts.py VARIANTS): as `enqueue`, and as `enqueue_plain`
-- without the includes flows and link_parent for calls with m = 0, so every use of their
-- definitions must stay behind m > 0 (tests/test_scripts.py checks the lines that name
-- them).
--
-- Per job this costs one HSET; the dedupe check, the ZADDs and the event are made once
-- per call for all its jobs, so a bulk call of 1,000 jobs is a few commands more than
-- 1,000 (one EXISTS, one ZADD per set, one XADD per 1,000 ids).

local maxlen = events_cap(ARGV[1])
local now = now_ms()
local scheduled, ready, marker, events, seq_key = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local m, nf = tonumber(ARGV[2]), tonumber(ARGV[3])
local n = (#ARGV - 3 - 5 * m - (m > 0 and 3 or 0) - 9 * nf) / 10
local waits = {}  -- job index -> the ARGV index of its 5 flow values
for j = 1, m do
  local at = 4 + 10 * n + (j - 1) * 5
  waits[tonumber(ARGV[at])] = at
end
local keyed = {}  -- job index -> the ARGV index of its 9 keyed values
for j = 1, nf do
  local at = 4 + 10 * n + 5 * m + (m > 0 and 3 or 0) + (j - 1) * 9
  keyed[tonumber(ARGV[at])] = at
end
local turns, dedupe_prefix, job_prefix = KEYS[#KEYS - 2], KEYS[#KEYS - 1], KEYS[#KEYS]
local floors = {}  -- fair_turn's floor of each priority in this call
local flow = m > 0 and flow_ctx(7 + n, 4 + 10 * n + 5 * m) or nil
local waiting_pairs = {}
-- per new job that waits: {its reply index, id, ARGV index of its flow values, index}
local new_waiting = {}
local placed_ids = {}  -- the new jobs that do not wait

-- Which jobs exist already: one EXISTS over every job key; per-job lookups only if any do.
local existing = {}
local some_exist = false
for first = 6, 5 + n, SLICE do
  local last = math.min(first + SLICE - 1, 5 + n)
  if redis.call('EXISTS', unpack(KEYS, first, last)) > 0 then
    some_exist = true
  end
end
if some_exist then
  for i = 1, n do
    local found = redis.call('HMGET', KEYS[5 + i], 's', 'r', 'e')
    if found[1] then
      existing[i] = found
    end
  end
end

local out = {}
local ready_pairs, scheduled_pairs, added_ids = {}, {}, {}
local added = {}  -- job id -> its reply index, for an id given twice in one call
local seq = nil  -- the FIFO number of the last ready job
local earliest = nil  -- the earliest run_at among the scheduled jobs added
local in_effect = {}  -- per job with a dedupe mode: the id of the job that stands for it
local scheduled_at = {}  -- job id -> the index of its run_at in scheduled_pairs

-- With a dedupe mode: the reply of a job replaced or ignored through the record `rec`
-- (4 values), or nil to add the job.
local function dedupe(rec, mode, window, a, now)
  local prev = redis.call('GET', rec)
  local prev_key = prev and job_prefix .. prev
  local f = prev and redis.call('HMGET', prev_key, 's', 'r', 'e') or {}
  if mode == 'throttle' then
    if prev then
      return {3, f[1] or 'gone', tonumber(f[2] or f[3]) or 0, tonumber(f[3]) or 0}
    end
    return nil
  end
  local replace = f[1] == 'scheduled' or (mode == 'keep_last' and f[1] == 'ready')
  if not replace then
    return nil
  end
  redis.call('HSET', prev_key, 'a', ARGV[a + 3])
  if ARGV[a + 4] ~= '{}' then
    redis.call('HSET', prev_key, 'k', ARGV[a + 4])
  else
    redis.call('HDEL', prev_key, 'k')
  end
  local run_at = tonumber(f[2] or f[3]) or now
  if mode == 'debounce' then
    run_at = wanted_run_at(ARGV[a + 6], ARGV[a + 7], now)
    if scheduled_at[prev] then  -- added by this call: its ZADD comes at the end
      scheduled_pairs[scheduled_at[prev]] = run_at
      out[added[prev] + 3] = run_at
    else
      redis.call('ZADD', scheduled, run_at, prev)
    end
    redis.call('HSET', prev_key, 'r', run_at)
    redis.call('PEXPIRE', rec, window + 3600000)
  end
  emit_jobs(events, maxlen, 'rescheduled', {prev}, now, nil, 'run_at', run_at)
  return {2, f[1], run_at, tonumber(f[3]) or 0}
end

for i = 1, n do
  local a = 3 + (i - 1) * 10
  local job_id = ARGV[a + 1]
  local found = existing[i]
  local twin = added[job_id]
  local kx = keyed[i]
  local deduped = nil
  if kx and ARGV[kx + 4] ~= '' and not found then
    deduped = dedupe(dedupe_prefix .. ARGV[kx + 3], ARGV[kx + 4], tonumber(ARGV[kx + 5]), a, now)
  end
  if kx and ARGV[kx + 4] ~= '' then
    in_effect[#in_effect + 1] = ''
  end
  if deduped then
    for _, value in ipairs(deduped) do
      out[#out + 1] = value
    end
    in_effect[#in_effect] = redis.call('GET', dedupe_prefix .. ARGV[kx + 3])
  elseif found then
    out[#out + 1] = 0
    out[#out + 1] = found[1]
    out[#out + 1] = tonumber(found[2] or found[3]) or 0
    out[#out + 1] = tonumber(found[3]) or 0
  elseif twin then
    out[#out + 1] = 0
    out[#out + 1] = out[twin + 2]
    out[#out + 1] = out[twin + 3]
    out[#out + 1] = out[twin + 4]
  else
    local priority = tonumber(ARGV[a + 5])
    local run_at = wanted_run_at(ARGV[a + 6], ARGV[a + 7], now)
    -- Fields equal to their default (run_at = enqueued_at, kwargs {}, priority 0, max
    -- attempts 1) are not stored: readers default them (saves memory and time).
    local fields = {'t', ARGV[a + 2], 'a', ARGV[a + 3], 'e', now}
    if run_at ~= now then
      fields[#fields + 1] = 'r'
      fields[#fields + 1] = run_at
    end
    if ARGV[a + 4] ~= '{}' then
      fields[#fields + 1] = 'k'
      fields[#fields + 1] = ARGV[a + 4]
    end
    if priority ~= 0 then
      fields[#fields + 1] = 'p'
      fields[#fields + 1] = priority
    end
    if ARGV[a + 8] ~= '1' then
      fields[#fields + 1] = 'm'
      fields[#fields + 1] = ARGV[a + 8]
    end
    if ARGV[a + 9] ~= '' then
      fields[#fields + 1] = 'o'
      fields[#fields + 1] = ARGV[a + 9]
    end
    if ARGV[a + 10] ~= '' then
      fields[#fields + 1] = 'tp'
      fields[#fields + 1] = ARGV[a + 10]
    end
    local ck = kx and ARGV[kx + 1] ~= '' and ARGV[kx + 1] or nil
    if ck then
      fields[#fields + 1] = 'ck'
      fields[#fields + 1] = ck
      fields[#fields + 1] = 'cl'
      fields[#fields + 1] = ARGV[kx + 2]
      if ARGV[kx + 6] ~= '0' then
        fields[#fields + 1] = 'kr'
        fields[#fields + 1] = ARGV[kx + 6]
        fields[#fields + 1] = 'kp'
        fields[#fields + 1] = ARGV[kx + 7]
      end
      if ARGV[kx + 8] ~= '1' then
        fields[#fields + 1] = 'cw'
        fields[#fields + 1] = ARGV[kx + 8]
      end
    end
    if kx and ARGV[kx + 4] ~= '' then
      local window, rec = tonumber(ARGV[kx + 5]), dedupe_prefix .. ARGV[kx + 3]
      local ttl = ARGV[kx + 4] == 'throttle' and window or window + 3600000
      if ARGV[kx + 4] == 'keep_last' then
        ttl = math.max(window, 86400000)
      end
      redis.call('SET', rec, job_id, 'PX', math.max(ttl, 1))
      in_effect[#in_effect] = job_id
    end
    local status
    local wait = waits[i]
    if wait then
      status = 'waiting'
      fields[#fields + 1] = 'd'
      fields[#fields + 1] = ARGV[wait + 1]
      if ARGV[wait + 2] ~= '' then
        fields[#fields + 1] = 'dp'
        fields[#fields + 1] = ARGV[wait + 2]
      end
      if ARGV[wait + 3] ~= '' then
        fields[#fields + 1] = 'dr'
        fields[#fields + 1] = ARGV[wait + 3]
      end
      local parents = {}
      for p = 1, #cjson.decode(ARGV[wait + 1]) do
        parents[#parents + 1] = p
      end
      call_sliced('SADD', KEYS[5 + i] .. ':w', parents)
      waiting_pairs[#waiting_pairs + 1] = now
      waiting_pairs[#waiting_pairs + 1] = job_id
      new_waiting[#new_waiting + 1] = {#out + 1, job_id, wait, i}
    elseif run_at <= now then
      placed_ids[#placed_ids + 1] = job_id
      -- made ready as mark_ready() would, in the job's one HSET below
      status = 'ready'
      if seq == nil then
        -- one INCRBY per call: numbers for every job of the call (gaps are harmless)
        seq = redis.call('INCRBY', seq_key, n * TURN) - n * TURN
      end
      seq = seq + TURN
      local turn = seq
      if ck then
        turn = fair_turn(turns, ready, seq_key, ck, priority, floors, tonumber(ARGV[kx + 8]))
      end
      ready_pairs[#ready_pairs + 1] = ready_score(priority, turn)
      ready_pairs[#ready_pairs + 1] = job_id
      fields[#fields + 1] = 'q'
      fields[#fields + 1] = turn
    else
      placed_ids[#placed_ids + 1] = job_id
      status = 'scheduled'
      scheduled_pairs[#scheduled_pairs + 1] = run_at
      scheduled_at[job_id] = #scheduled_pairs
      scheduled_pairs[#scheduled_pairs + 1] = job_id
      if earliest == nil or run_at < earliest then
        earliest = run_at
      end
    end
    fields[#fields + 1] = 's'
    fields[#fields + 1] = status
    redis.call('HSET', KEYS[5 + i], unpack(fields))
    added_ids[#added_ids + 1] = job_id
    added[job_id] = #out
    out[#out + 1] = 1
    out[#out + 1] = status
    out[#out + 1] = run_at
    out[#out + 1] = now
  end
end

-- A job that becomes the earliest scheduled one must wake an idle worker: read the
-- head before adding.
local wake_at = nil
if earliest then
  local head = redis.call('ZRANGE', scheduled, 0, 0, 'WITHSCORES')
  if head[2] == nil or earliest < tonumber(head[2]) then
    wake_at = earliest
  end
  call_sliced('ZADD', scheduled, scheduled_pairs)
end
if flow then
  call_sliced('ZADD', flow.waiting, waiting_pairs)
end
add_ready(ready, ready_pairs, marker)  -- work is ready: wake one idle worker
if wake_at then
  redis.call('ZADD', marker, wake_at, '1')
end

-- One entry for the call's jobs; those that wait in one more, which says so (the
-- mirror reads their status from the hash, the lake from the entry).
if #new_waiting == 0 then
  emit_jobs(events, maxlen, 'enqueued', added_ids, now)
else
  local waiting_ids = {}
  for _, w in ipairs(new_waiting) do
    waiting_ids[#waiting_ids + 1] = w[2]
  end
  emit_jobs(events, maxlen, 'enqueued', placed_ids, now)
  emit_jobs(events, maxlen, 'enqueued', waiting_ids, now, nil, 'status', 'waiting')
end
if #added_ids > 0 then
  redis.call('HINCRBY', KEYS[6 + n], 'e', #added_ids)
end
if #added_ids < n then
  -- Counting duplicates is also a write: a WAIT after a call that found every job there
  -- already (a retry after NotReplicated) then covers the earlier write of those jobs;
  -- Redis 7.2+ advances a connection's WAIT offset only when its command wrote something.
  redis.call('HINCRBY', KEYS[6 + n], 'du', n - #added_ids)
end

-- Link the jobs that wait to their parents of this shard, in this call; in call order,
-- so that a job may wait for one enqueued before it in the same call.
if #new_waiting > 0 then
  local linking = KEYS[18 + n]
  for _, w in ipairs(new_waiting) do
    local at, job_id = w[3], w[2]
    local parents = cjson.decode(ARGV[at + 1])
    local here = {}
    for index in string.gmatch(ARGV[at + 4], '%d+') do
      here[tonumber(index)] = true
    end
    local elsewhere = false
    for p = 1, #parents do
      if here[p] then
        local parent_id = parents[p][2]
        local outcome, result = link_parent(flow.prefix, parent_id, 'L ' .. p .. ' ' .. job_id)
        if outcome then
          resolve_dependant(flow, job_id, p, outcome, result, parent_id, now)
        end
      else
        elsewhere = true
      end
    end
    if elsewhere then
      redis.call('ZADD', linking, now, job_id)
    end
    out[w[1] + 1] = redis.call('HGET', KEYS[5 + w[4]], 's')
  end
  trim_finished_waiting(flow, now)
end
for _, job_id in ipairs(in_effect) do
  out[#out + 1] = job_id
end
return out
