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
