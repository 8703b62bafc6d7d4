-- include: call_sliced

-- Add `scored_ids` ((ready score, id) pairs) to the ready set; with `marker_key`, wake
-- an idle worker (the caller may hold the wake-up back, as a claim does while its
-- window is full). Each job's hash is marked ready apart (mark_ready.lua).
local function add_ready(ready_key, scored_ids, marker_key)
  if #scored_ids == 0 then
    return
  end
  call_sliced('ZADD', ready_key, scored_ids)
  if marker_key then
    redis.call('ZADD', marker_key, 0, '0')
  end
end
