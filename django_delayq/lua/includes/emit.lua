-- Append a lifecycle event to the queue's stream (capped, approximate trim).
local function emit(events_key, maxlen, event, job_id, now, ...)
  if maxlen > 0 then
    redis.call('XADD', events_key, 'MAXLEN', '~', maxlen, '*',
      'event', event, 'job', job_id, 'ts', now, ...)
  end
end
