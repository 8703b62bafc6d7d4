-- include: now_ms
-- include: call_sliced
-- include: emit
-- include: emit_jobs
-- include: count_minute
-- include: trim_finished
-- include: expire_finished
-- include: histogram
-- include: is_leased
-- include: flows
-- include: notify_dependants
-- include: keyed_ctx
-- include: free_slot

-- Acknowledge finished jobs. A job is completed only by the attempt that holds its
-- lease: a late ack from a worker whose lease lapsed (and whose job was reclaimed or
-- re-run) changes nothing. A job is in the active set exactly while its hash says
-- 'claimed' or 'active' (claim sets both, every script that takes it out changes the
-- status), so the status and attempt decide, and the acked jobs leave the set in one ZREM.
--
-- KEYS[1] active     ZSET  leased job ids by lease deadline (ms)
-- KEYS[2] completed  ZSET  completed job ids by finish time (ms)
-- KEYS[3] events     STREAM lifecycle events
-- KEYS[4] stats      HASH  per-minute counters, totals, the duration histogram, and
--                           the start lateness of a job whose start note never landed
-- KEYS[5] job key prefix (job keys are KEYS[5] .. id; same hash tag)
-- KEYS[6..16] the shard's keys for releasing dependants (flow_ctx in flows.lua)
-- KEYS[17..21] the shard's concurrency-key keys (keyed_ctx.lua): a completed
--              job frees its key's slot
--
-- ARGV[1..3] the settings for releasing dependants (flow_ctx)
-- ARGV[4] result time to live (ms; 0: delete the job at once)
-- ARGV[5] most completed ids to keep
-- ARGV[6] events stream bounds, `maxlen:max_bytes` (events_cap in emit.lua)
-- ARGV[7..] per job, 5 values: id, attempt (the lease token), result JSON, start ms
--           (stored when the start was never noted), run time ms as the worker measured
--           it (-1: unknown)
--
-- The duration histogram ('hd') takes the run time the ack carries: now - start would
-- add the time the outcome waited in the worker before its ack was sent. An ack
-- without one (-1) falls back to now - start.
--
-- The completing attempt is not appended to the attempt log (field h): the hash's own
-- n, w, b and f are its entry (readers add it: with_completed_attempt in
-- engine/jobhash.py), and a job completed at its first attempt then stores no log, which
-- keeps its hash in Redis's compact encoding.
--
-- Returns, per job: 1 completed, 2 completed with releases of dependants in other
-- shards left in the outbox (for the worker to deliver), 0 stale (the attempt no longer
-- holds the lease). Dependants in this shard are released here, in the same call.

local active, completed, events, stats, job_prefix = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local ttl, keep, maxlen = tonumber(ARGV[4]), tonumber(ARGV[5]), events_cap(ARGV[6])
local flow = flow_ctx(6, 1)
local kc = keyed_ctx(17)
local now = now_ms()
local out = {}
local finished, ids, attempts, durations = {}, {}, {}, {}
local unnoted, unnoted_attempts, lateness = {}, {}, {}  -- acked while 'claimed': no start note
for i = 7, #ARGV, 5 do
  local job_id, attempt = ARGV[i], ARGV[i + 1]
  local job_key = job_prefix .. job_id
  local f = redis.call('HMGET', job_key, 's', 'n', 'b', 'dc', 'ck', 'r', 'e')
  if is_leased(f[1]) and f[2] == attempt then
    local started = f[3] or (ARGV[i + 3] ~= '0' and ARGV[i + 3]) or nil
    if f[1] == 'claimed' then
      unnoted[#unnoted + 1] = job_id
      unnoted_attempts[#unnoted_attempts + 1] = attempt
      local began = math.min(tonumber(started) or now, now)
      lateness[#lateness + 1] = began - (tonumber(f[6] or f[7]) or began)
    end
    local ran = tonumber(ARGV[i + 4]) or -1
    durations[#durations + 1] = ran >= 0 and ran or now - (tonumber(started) or now)
    if started and not f[3] then
      redis.call('HSET', job_key, 's', 'completed', 'f', now, 'v', ARGV[i + 2], 'b', started)
    else
      redis.call('HSET', job_key, 's', 'completed', 'f', now, 'v', ARGV[i + 2])
    end
    expire_finished(job_key, ttl)
    finished[#finished + 1] = now
    finished[#finished + 1] = job_id
    ids[#ids + 1] = job_id
    attempts[#attempts + 1] = attempt
    if f[5] then
      free_slot(kc, f[5], flow.ready, flow.marker, job_prefix)
    end
    if f[4] and notify_dependants(flow, job_id, 'completed', ARGV[i + 2], now) > 0 then
      out[#out + 1] = 2
    else
      out[#out + 1] = 1
    end
  else
    out[#out + 1] = 0
  end
end
if #ids > 0 then
  call_sliced('ZREM', active, ids)
  emit_jobs(events, maxlen, 'started', unnoted, now, unnoted_attempts)
  call_sliced('ZADD', completed, finished)
  emit_jobs(events, maxlen, 'completed', ids, now, attempts)
  count_minute(stats, 'c', now, #ids)
  observe(stats, 'hd', durations)
  observe(stats, 'hl', lateness)
  trim_finished(completed, job_prefix, now, ttl, keep)
end
return out
