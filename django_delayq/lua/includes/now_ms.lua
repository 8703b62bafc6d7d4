-- The Redis server clock, in milliseconds: the only clock that decides what is due.
local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
