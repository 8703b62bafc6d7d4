-- How many minutes of per-minute counters (`c:<minute>`, `f:<minute>`) a stats hash
-- keeps: count_minute.lua forgets the minute this far back, counters.lua older ones.
local MINUTES_KEPT = 120
