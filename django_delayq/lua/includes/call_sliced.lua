-- include: slice

-- Run `command key values...` over `values` in slices (ZADD pairs stay whole: SLICE is even).
local function call_sliced(command, key, values)
  for first = 1, #values, SLICE do
    redis.call(command, key, unpack(values, first, math.min(first + SLICE - 1, #values)))
  end
end
