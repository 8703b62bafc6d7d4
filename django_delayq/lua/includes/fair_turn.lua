-- include: ready_score
-- include: turn

-- The FIFO number of a keyed job made ready: one turn after its key's last job, and no
-- earlier than the first ready job of its priority (the queue's FIFO counter when there
-- is none), so a key with a backlog and a key with one job alternate (round robin),
-- FIFO within each key. A turn is TURN numbers; a job of weight w (1..TURN) moves its
-- key TURN / w on (the key's record keeps the fraction; the job gets the whole part,
-- so its numbers still rise), so a key of weight 3 takes 3 jobs for each 1 of a key of
-- weight 1 while both have a backlog. `floors` memoizes the floor of each priority.
local function fair_turn(turns, ready, seq_key, key, priority, floors, weight)
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
  local turn = math.max(floor, tonumber(redis.call('HGET', turns, key)) or 0) + TURN / weight
  redis.call('HSET', turns, key, turn)
  return math.floor(turn)
end
