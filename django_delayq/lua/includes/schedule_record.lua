-- A periodic task's schedule record, a field of the schedules HASH next to its mark:
-- '<tag> <since> <seen> <spec>'. tag: a short hash of the schedule (and its queue);
-- since: the start (ms) of the newest scheduler that runs it; seen: the last step (ms)
-- of one that did; spec: the schedule as JSON, to cancel its jobs once it is replaced.
-- Returns tag, since, seen (numbers) and spec; nil when the text is none of that.
local function schedule_record(text)
  if not text then
    return nil
  end
  local tag, since, seen, spec = string.match(text, '^(%S+) (%d+) (%d+) (.*)$')
  if not tag then
    return nil
  end
  return tag, tonumber(since), tonumber(seen), spec
end
