-- include: now_ms
-- include: emit
-- include: is_leased

-- Record the progress a running job reports (current_job().set_progress()).
--
-- KEYS[1] job hash
-- KEYS[2] events stream
--
-- ARGV[1] job id
-- ARGV[2] attempt (the lease token): an attempt that lost its lease writes nothing
-- ARGV[3] fraction, 0..1, as text
-- ARGV[4] message ('' removes it)
-- ARGV[5] events stream bounds, `maxlen:max_bytes` (events_cap in emit.lua)
-- ARGV[6] 1: also add a 'progress' event for the mirror, 0: only the hash
--
-- Returns 1 when written, 0 when the job is not this attempt's leased job ('claimed' is
-- accepted: the worker sends its start note with its next acks, after the task began).

local job_key, events = KEYS[1], KEYS[2]
local f = redis.call('HMGET', job_key, 's', 'n')
if not is_leased(f[1]) or f[2] ~= ARGV[2] then
  return 0
end
if ARGV[4] == '' then
  redis.call('HSET', job_key, 'g', ARGV[3])
  redis.call('HDEL', job_key, 'gm')
else
  redis.call('HSET', job_key, 'g', ARGV[3], 'gm', ARGV[4])
end
if ARGV[6] == '1' then
  emit(events, events_cap(ARGV[5]), 'progress', ARGV[1], now_ms(), 'g', ARGV[3], 'gm', ARGV[4])
end
return 1
