-- The Redis server clock in milliseconds (now_ms() gives that alone), and the
-- microseconds past that millisecond: a wait timed from both is exact to the microsecond
-- (claim.lua: a worker that waited from the millisecond alone would wake up to a
-- millisecond late).
local function now_ms_us()
  local t = redis.call('TIME')
  local micros = tonumber(t[2])
  return tonumber(t[1]) * 1000 + math.floor(micros / 1000), micros % 1000
end
