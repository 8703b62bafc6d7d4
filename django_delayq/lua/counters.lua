-- include: now_ms
-- include: call_sliced
-- include: minutes_kept

-- Read a shard's stats hash with its running totals made monotone: what the metrics,
-- the dashboard and the API show. The scripts only ever add to the totals, but a
-- failover can lose a primary's last increments, and a figure that goes back reads as
-- a reset to Prometheus. So each total is shown as raw + offset, and marks kept in the
-- same hash hold, per total, the last figure shown and its offset: when raw + offset
-- falls below the last figure shown, the offset grows by the difference and the figure
-- stays where it was. Every reader of the shard (any web process) goes through here, so
-- they all show the same figures. One key: a slot being moved between cluster nodes
-- serves it as long as the hash is on one side (two keys would answer TRYAGAIN).
--
-- The per-minute counters (`c:<minute>`, `f:<minute>`) are rolling windows, not totals:
-- they are passed through as stored. count_minute.lua forgets only the minute exactly
-- MINUTES_KEPT back, so with more per-minute fields than the two kinds keep, the older
-- ones (a queue busy now and then) are deleted here: the hash, and this read, stay
-- bounded. Fewer cost no more than the count.
--
-- KEYS[1] stats  HASH  the shard's totals, histograms and per-minute counters, and the
--                      marks: `m:x:<field>` the last figure shown, `m:o:<field>` its
--                      offset, `m:t` when the marks began (epoch ms): no figure went
--                      back since
--
-- ARGV[1] 1: return the per-minute counters too (the dashboard's throughput), 0: not
--
-- Returns {t, {field, value, field, value, ...}}: the stats hash as HGETALL answers it,
-- without the marks (and the per-minute counters unless asked for), with every total
-- replaced by its monotone figure (a total the hash lost while its mark stayed is there
-- too, at its last figure); {0, {}} for a shard that has counted nothing, which a read
-- leaves without a key.

local stats = KEYS[1]
local minutes = ARGV[1] == '1'
local raw = redis.call('HGETALL', stats)
if #raw == 0 then
  return {0, {}}  -- nothing counted yet: a read never creates the hash (any queue name)
end
local COLON, M, X, O = string.byte(':'), string.byte('m'), string.byte('x'), string.byte('o')
-- A field's second byte is ':' for the per-minute counters and the marks only (totals
-- are `e`, `du`, `c`, `f`, `r`, `hd:<i>`, `hl:<i>`), and a mark's third byte says which:
-- one pass over the hash, without a pattern or a concatenation per field (a busy shard
-- has some 250 per-minute fields and 75 marks).
local totals, last, offset, began, per_minute = {}, {}, {}, nil, 0
for i = 1, #raw, 2 do
  local first, second, third = string.byte(raw[i], 1, 3)
  if second ~= COLON then
    totals[#totals + 1] = i
  elseif first ~= M then
    per_minute = per_minute + 1
  elseif third == X then
    last[string.sub(raw[i], 5)] = tonumber(raw[i + 1])
  elseif third == O then
    offset[string.sub(raw[i], 5)] = tonumber(raw[i + 1])
  else
    began = tonumber(raw[i + 1])  -- m:t
  end
end
local stale = {}  -- per-minute field -> true if over MINUTES_KEPT old (too many kept)
if per_minute > 2 * MINUTES_KEPT then
  local oldest, gone = math.floor(now_ms() / 60000) - MINUTES_KEPT, {}
  for i = 1, #raw, 2 do
    local field = raw[i]
    local first, second = string.byte(field, 1, 2)
    if second == COLON and first ~= M and (tonumber(string.sub(field, 3)) or 0) <= oldest then
      stale[field] = true
      gone[#gone + 1] = field
    end
  end
  call_sliced('HDEL', stats, gone)
end

local out, seen, changed = {}, {}, {}
local function show(field, value)
  local shown = last[field]
  local figure = value + (offset[field] or 0)
  if shown ~= nil and figure < shown then
    changed[#changed + 1] = 'm:o:' .. field
    changed[#changed + 1] = (offset[field] or 0) + shown - figure
    figure = shown
  end
  if figure ~= shown then
    changed[#changed + 1] = 'm:x:' .. field
    changed[#changed + 1] = figure
  end
  out[#out + 1] = field
  out[#out + 1] = figure
end

for _, i in ipairs(totals) do
  seen[raw[i]] = true
  show(raw[i], tonumber(raw[i + 1]) or 0)
end
for field in pairs(last) do
  if not seen[field] then
    show(field, 0)
  end
end
if minutes then
  for i = 1, #raw, 2 do
    local field = raw[i]
    local first, second = string.byte(field, 1, 2)
    if second == COLON and first ~= M and not stale[field] then
      out[#out + 1] = field
      out[#out + 1] = raw[i + 1]
    end
  end
end

if began == nil then
  began = now_ms()
  changed[#changed + 1] = 'm:t'
  changed[#changed + 1] = began
end
if #changed > 0 then
  -- A Redis at its maxmemory (noeviction, as required) refuses the marks' HSET: the
  -- figures are still answered, computed from the marks it holds (they only lag until
  -- it has room again), so the metrics do not go dark when they are needed most.
  redis.pcall('HSET', stats, unpack(changed))
end
return {began, out}
