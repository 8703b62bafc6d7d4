-- Whether a job's status says it is leased: claimed (waiting in a worker's buffer) or
-- active (a worker's thread runs it).
local function is_leased(status)
  return status == 'active' or status == 'claimed'
end
