-- The run_at asked for: an absolute time, a delay from now, or now.
local function wanted_run_at(run_at_arg, delay_arg, now)
  if run_at_arg ~= '' then
    return tonumber(run_at_arg)
  end
  if delay_arg ~= '' then
    return now + tonumber(delay_arg)
  end
  return now
end
