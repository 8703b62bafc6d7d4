-- Per-key flow control (engine/keyed.py, docs/flow-control.md). A job with a concurrency
-- key holds 'ck' (the key) and 'cl' (at most that many of the key's jobs leased at once).
-- The shard's keys (engine/commands.py `_keyed_keys` builds them, in this order):
--   active   ZSET  key -> how many of its jobs are in the active set (absent: none)
--   waiting  ZSET  key -> how many of its jobs are parked (waiting for a slot); the
--                  member '' (no key is empty) holds the shard's total
--   turns    HASH  key -> the FIFO number given to its last job made ready (fair turns)
--   park     the prefix of each key's parked jobs: ZSET <park><key>, by ready score
--   rate     the prefix of each key's start-rate window (rate_limit.lua): ZSET <rate><key>
--            of a job with 'kr' starts per 'kp' ms; a job the window refuses is scheduled
--            for the window's next start instead of parked (no slot will wake it)
-- A job the claim pops while its key is at its limit is parked (status still 'ready',
-- field 'kw' set) instead of leased, and the claim goes on with the next job: no head
-- of line blocking. Every script that takes a keyed job out of the active set frees its
-- slot (free_slot), which makes the key's oldest parked job ready again at its old place.
-- A job is parked only while its key holds at least one slot, so a parked job always
-- has a slot freed after it: none waits for ever, and no slot leaks. The job a freed
-- slot woke holds no slot until its claim: cancelled or moved before (cancel.lua,
-- reschedule.lua), it wakes the next parked job in its place. A parked job cancelled or
-- moved leaves its park set at once (unpark.lua).

-- The keyed keys given as KEYS[first..first+4].
local function keyed_ctx(first)
  return {active = KEYS[first], waiting = KEYS[first + 1], turns = KEYS[first + 2],
          park = KEYS[first + 3], rate = KEYS[first + 4]}
end
