-- Concurrency keys (keyed_ctx.lua): a key's turn dropped with its last job.

-- The job numbered `seq` left its key's queue (claimed, cancelled or moved): if it was
-- the key's last job made ready, drop the key's turn, so the key's next job starts its
-- turns afresh and no turn is kept for a key with no job (one per user would grow).
local function drop_turn(k, key, seq)
  local last = tonumber(redis.call('HGET', k.turns, key))
  if seq and last and math.floor(last) == tonumber(seq) then
    redis.call('HDEL', k.turns, key)
  end
end
