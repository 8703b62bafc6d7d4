-- include: now_ms_us

-- The Redis server clock, in milliseconds: the only clock that decides what is due.
local function now_ms()
  return (now_ms_us())
end
