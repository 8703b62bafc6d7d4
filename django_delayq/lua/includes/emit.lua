-- The bounds of a queue's events stream, from the ARGV value `maxlen:max_bytes`
-- (EngineConfig.events_cap writes it): about maxlen entries at most (0: no events), and
-- max_bytes of memory (0: no byte bound).
local function events_cap(value)
  local maxlen, max_bytes = string.match(value, '^(%d+):(%d+)$')
  return {len = tonumber(maxlen), bytes = tonumber(max_bytes)}
end

-- Keep the stream within cap.bytes. Redis's estimate of its memory (MEMORY USAGE) samples
-- its 64 oldest nodes, which may be smaller than the newer ones: past nine tenths of the
-- bound by that estimate, the oldest entries go until it is at eight tenths. `n`: its
-- length, if known.
local function trim_to_bytes(events_key, cap, n)
  local used = redis.call('MEMORY', 'USAGE', events_key, 'SAMPLES', 64)
  if used and used > cap.bytes * 0.9 then
    n = n or redis.call('XLEN', events_key)
    redis.call('XTRIM', events_key, 'MAXLEN', math.max(1, math.floor(n * cap.bytes * 0.8 / used)))
  end
end

-- trim_to_bytes once an entry of one job, of about `entry_bytes` (its values), was added:
-- asked only when the stream could be over its bound were every entry this large (and its
-- allocation a quarter more, the allocator's size classes). Entries of many jobs always
-- ask (emit_jobs): one question per batch of jobs.
local function trim_bytes(events_key, cap, entry_bytes)
  entry_bytes = entry_bytes * 1.25
  if cap.bytes <= 0 or cap.len * entry_bytes <= cap.bytes * 0.9 then
    return
  end
  local n = redis.call('XLEN', events_key)
  if n * entry_bytes > cap.bytes * 0.9 then
    trim_to_bytes(events_key, cap, n)
  end
end

-- Append a lifecycle event to the queue's stream (capped: trimmed by entries, about, and
-- by bytes).
local function emit(events_key, cap, event, job_id, now, ...)
  if cap.len > 0 then
    redis.call('XADD', events_key, 'MAXLEN', '~', cap.len, '*',
      'event', event, 'job', job_id, 'ts', now, ...)
    local size = 48 + #event + #job_id
    for i = 1, select('#', ...) do
      size = size + #tostring((select(i, ...)))
    end
    trim_bytes(events_key, cap, size)
  end
end
