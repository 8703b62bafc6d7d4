-- Enqueue jobs, skipping every job whose id already exists (dedupe while the job exists).
--
-- KEYS[1] scheduled  ZSET  job ids by run_at (ms)
-- KEYS[2] ready      ZSET  job ids by ready score
-- KEYS[3] marker     ZSET  wake-up marks for idle workers
-- KEYS[4] events     STREAM lifecycle events
-- KEYS[5] seq        STRING FIFO counter
-- KEYS[6..5+n]       HASH  one job key per job, in ARGV order
--
-- ARGV[1] events stream max length (0: no events)
-- ARGV[2..] per job, 8 values: id, task, args JSON, kwargs JSON, priority,
--           run_at ms ('' for none), delay ms ('' for none), max attempts
--
-- Returns, per job, 4 values: added (1, or 0 for a duplicate), status, run_at ms,
-- enqueued_at ms (of the existing job for a duplicate).

local maxlen = tonumber(ARGV[1])
local now = now_ms()
local scheduled, ready, marker, events, seq_key = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local out = {}
local n = (#ARGV - 1) / 8
local head = nil  -- earliest scheduled run_at, read once per call
local seq = nil  -- the FIFO number of the last ready job
local wake_at = nil
local any_ready = false
for i = 1, n do
  local a = 1 + (i - 1) * 8
  local job_id = ARGV[a + 1]
  local job_key = KEYS[5 + i]
  local existing = redis.call('HMGET', job_key, 's', 'r', 'e')
  if existing[1] then
    out[#out + 1] = 0
    out[#out + 1] = existing[1]
    out[#out + 1] = tonumber(existing[2]) or 0
    out[#out + 1] = tonumber(existing[3]) or 0
  else
    local priority = tonumber(ARGV[a + 5])
    local run_at = wanted_run_at(ARGV[a + 6], ARGV[a + 7], now)
    -- Empty kwargs, priority 0 and max attempts 1 are not stored: readers default them
    -- (saves memory).
    local fields = {'t', ARGV[a + 2], 'a', ARGV[a + 3], 'e', now, 'r', run_at}
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
    local status
    if run_at <= now then
      status = 'ready'
      if seq == nil then
        -- one INCRBY per call: numbers for every job of the call (gaps are harmless)
        seq = redis.call('INCRBY', seq_key, n) - n
      end
      seq = seq + 1
      redis.call('ZADD', ready, ready_score(priority, seq), job_id)
      fields[#fields + 1] = 'q'
      fields[#fields + 1] = seq
      any_ready = true
    else
      status = 'scheduled'
      if head == nil then
        local first = redis.call('ZRANGE', scheduled, 0, 0, 'WITHSCORES')
        head = tonumber(first[2]) or math.huge
      end
      redis.call('ZADD', scheduled, run_at, job_id)
      if run_at < head and (wake_at == nil or run_at < wake_at) then
        wake_at = run_at
      end
    end
    fields[#fields + 1] = 's'
    fields[#fields + 1] = status
    redis.call('HSET', job_key, unpack(fields))
    emit(events, maxlen, 'enqueued', job_id, now)
    out[#out + 1] = 1
    out[#out + 1] = status
    out[#out + 1] = run_at
    out[#out + 1] = now
  end
end
-- Wake one idle worker: work is ready, or a job became the earliest scheduled one.
if any_ready then
  redis.call('ZADD', marker, 0, '0')
end
if wake_at then
  redis.call('ZADD', marker, wake_at, '1')
end
return out
