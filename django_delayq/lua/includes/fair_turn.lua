-- include: ready_score

-- The FIFO number of a keyed job made ready: one turn after its key's last job, and no
-- earlier than the first ready job of its priority (the queue's FIFO counter when there
-- is none), so a key with a backlog and a key with one job alternate (round robin),
-- FIFO within each key. `floors` memoizes the floor of each priority for the call.
local function fair_turn(turns, ready, seq_key, key, priority, floors)
  local floor = floors[priority]
  if floor == nil then
    local band = ready_score(priority, 0)
    local head = redis.call('ZRANGEBYSCORE', ready, band, band + PRIORITY_STEP - 1,
      'WITHSCORES', 'LIMIT', 0, 1)
    if head[2] then
      floor = tonumber(head[2]) - band
    else
      floor = tonumber(redis.call('GET', seq_key)) or 0
    end
    floors[priority] = floor
  end
  local seq = math.max(floor, tonumber(redis.call('HGET', turns, key)) or 0) + 1
  redis.call('HSET', turns, key, seq)
  return seq
end
