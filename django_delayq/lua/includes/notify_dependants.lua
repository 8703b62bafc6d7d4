-- include: flows

-- Tell the dependants of `job_id`, which finished for good with `outcome`, in this
-- shard at once and elsewhere through the outbox; a dependant its policy finishes tells
-- its own in turn (a worklist, not recursion). Returns how many entries were pushed to
-- the outbox. Call it before trimming the set `job_id` went to: a trim may drop the
-- job with its set of dependants, which would then wait for ever.
local function notify_dependants(k, job_id, outcome, result, now)
  local work, pushed, i = {{job_id, outcome, result}}, 0, 1
  while i <= #work do
    local parent_id, out, res = work[i][1], work[i][2], work[i][3]
    i = i + 1
    local set_key = k.prefix .. parent_id .. ':c'
    local members = redis.call('SMEMBERS', set_key)
    if #members > 0 then
      -- kept for Job.children while the parent's hash lives (resolving again is harmless)
      local pttl = redis.call('PTTL', k.prefix .. parent_id)
      if pttl > 0 then
        redis.call('PEXPIRE', set_key, pttl)
      elseif pttl == -2 then
        redis.call('DEL', set_key)
      end
    end
    for _, m in ipairs(members) do
      if string.sub(m, 1, 1) == 'L' then
        local _, _, index, child = string.find(m, '^L (%d+) (.+)$')
        local ended = resolve_dependant(k, child, index, out, res, parent_id, now)
        if ended then
          work[#work + 1] = {child, ended, 'null'}
        end
      else
        redis.call('RPUSH', k.outbox, cjson.encode({m = m, o = out, p = parent_id, v = res}))
        pushed = pushed + 1
      end
    end
  end
  trim_finished_waiting(k, now)  -- every dependant finished here has told its own
  return pushed
end
