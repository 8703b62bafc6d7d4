-- The Redis server clock, in milliseconds: the only clock that decides what is due.
-- now_ms_us() also gives the microseconds past that millisecond, for a wait timed to the
-- microsecond (claim.lua: a worker that waited from the millisecond alone would wake up
-- to a millisecond late).
local function now_ms_us()
  local t = redis.call('TIME')
  local micros = tonumber(t[2])
  return tonumber(t[1]) * 1000 + math.floor(micros / 1000), micros % 1000
end

local function now_ms()
  return (now_ms_us())
end
