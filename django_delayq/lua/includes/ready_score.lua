-- 2^45: priorities are 2^45 apart in the ready score, so a ready score stays an exact
-- integer in a double ((100 - priority) * 2^45 + seq < 2^53) for 2^45 jobs per queue.
local PRIORITY_STEP = 35184372088832

-- A job's score in the ready set: higher priority first, then FIFO by `seq`.
local function ready_score(priority, seq)
  return (100 - priority) * PRIORITY_STEP + seq
end
