-- Upper bounds (ms) of the duration and start-lateness histograms kept in the stats
-- hash; django_delayq/engine/stats.py repeats them. Bucket i counts values in
-- (bound i-1, bound i]; bucket #HISTOGRAM_MS + 1 counts the rest.
local HISTOGRAM_MS = {5, 10, 25, 50, 100, 250, 500, 1000, 2500, 5000, 10000, 30000, 60000,
  300000}

-- Add `values` (ms) to the histogram `name` of the stats hash: field `name:i` per
-- bucket, `name:sum` the sum. One HINCRBY per bucket the call's values fall in, and one
-- for the sum: a call's jobs usually share one or two buckets.
local function observe(stats_key, name, values)
  if #values == 0 then
    return
  end
  local counts, sum = {}, 0
  for _, v in ipairs(values) do
    if v < 0 then
      v = 0
    end
    local b = #HISTOGRAM_MS + 1
    for i = 1, #HISTOGRAM_MS do
      if v <= HISTOGRAM_MS[i] then
        b = i
        break
      end
    end
    counts[b] = (counts[b] or 0) + 1
    sum = sum + v
  end
  for b, c in pairs(counts) do
    redis.call('HINCRBY', stats_key, name .. ':' .. b, c)
  end
  redis.call('HINCRBY', stats_key, name .. ':sum', sum)
end
