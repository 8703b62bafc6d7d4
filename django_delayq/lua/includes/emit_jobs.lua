-- include: emit
-- include: slice

-- One event for the jobs `ids`: `job` names a single one, `jobs` several (space-separated;
-- ids hold no spaces), at most SLICE per entry. `attempts` (or nil) holds each job's
-- attempt, written as `attempt` for one job and as `attempts` (in the order of `jobs`)
-- for several; `...` are more fields, the same for every job.
local function emit_jobs(events_key, cap, event, ids, now, attempts, ...)
  if cap.len <= 0 or #ids == 0 then
    return
  end
  if #ids == 1 then
    if attempts then
      emit(events_key, cap, event, ids[1], now, 'attempt', attempts[1], ...)
    else
      emit(events_key, cap, event, ids[1], now, ...)
    end
    return
  end
  for first = 1, #ids, SLICE do
    local last = math.min(first + SLICE - 1, #ids)
    local jobs = table.concat(ids, ' ', first, last)
    if attempts then
      local of_jobs = table.concat(attempts, ' ', first, last)
      redis.call('XADD', events_key, 'MAXLEN', '~', cap.len, '*', 'event', event, 'jobs', jobs,
        'attempts', of_jobs, 'ts', now, ...)
    else
      redis.call('XADD', events_key, 'MAXLEN', '~', cap.len, '*', 'event', event, 'jobs', jobs,
        'ts', now, ...)
    end
  end
  if cap.bytes > 0 then
    trim_to_bytes(events_key, cap)
  end
end
