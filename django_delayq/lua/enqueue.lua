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
local k = {scheduled = KEYS[1], ready = KEYS[2], marker = KEYS[3], seq = KEYS[5]}
local out = {}
local n = (#ARGV - 1) / 8
for i = 1, n do
  local a = 1 + (i - 1) * 8
  local job_id = ARGV[a + 1]
  local job_key = KEYS[5 + i]
  local existing = redis.call('HMGET', job_key, 'status', 'run_at', 'enqueued_at')
  if existing[1] then
    out[#out + 1] = 0
    out[#out + 1] = existing[1]
    out[#out + 1] = tonumber(existing[2]) or 0
    out[#out + 1] = tonumber(existing[3]) or 0
  else
    local priority = tonumber(ARGV[a + 5])
    local run_at = wanted_run_at(ARGV[a + 6], ARGV[a + 7], now)
    redis.call('HSET', job_key, 'task', ARGV[a + 2], 'args', ARGV[a + 3],
      'kwargs', ARGV[a + 4], 'priority', priority, 'enqueued_at', now,
      'attempts', 0, 'max_attempts', ARGV[a + 8])
    local status = place_job(k, job_key, job_id, priority, run_at, now)
    emit(KEYS[4], maxlen, 'enqueued', job_id, now)
    out[#out + 1] = 1
    out[#out + 1] = status
    out[#out + 1] = run_at
    out[#out + 1] = now
  end
end
return out
