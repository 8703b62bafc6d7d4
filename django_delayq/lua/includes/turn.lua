-- FIFO numbers step by TURN a job (the queue's counter takes TURN per job, a keyed job
-- moves its key TURN / weight on), so a key of weight w takes w numbers per turn of a
-- key of weight 1 (fair_turn.lua; engine/keyed.py MAX_WEIGHT is TURN). Within a priority
-- (2^45 numbers, ready_score.lua) a shard's counter has room for 2^41 jobs.
local TURN = 16
