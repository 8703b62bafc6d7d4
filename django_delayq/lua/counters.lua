-- include: now_ms

-- Read a shard's stats hash with its running totals made monotone: what the metrics,
-- the dashboard and the API show. The scripts only ever add to the totals, but a
-- failover can lose a primary's last increments (or the whole hash, where nothing was
-- replicated yet), and a figure that goes back reads as a reset to Prometheus. So each
-- total is shown as raw + offset, and the marks hash keeps, per total, the last figure
-- shown and its offset: when raw + offset falls below the last figure shown, the offset
-- grows by the difference and the figure stays where it was. Every reader of the shard
-- (any web process) goes through here, so they all show the same figures.
--
-- The per-minute counters (`c:<minute>`, `f:<minute>`) are rolling windows, not totals:
-- they are passed through as stored.
--
-- KEYS[1] stats  HASH  the shard's totals, histograms and per-minute counters
-- KEYS[2] marks  HASH  `x:<field>` last figure shown, `o:<field>` its offset, `t` when
--                      the marks began (epoch ms): the figures never went back since
--
-- Returns {t, {field, value, field, value, ...}}: the stats hash as HGETALL answers it,
-- with every total replaced by its monotone figure (a total the hash lost entirely is
-- there too, at its last figure).

local stats, marks = KEYS[1], KEYS[2]
local raw = redis.call('HGETALL', stats)
local stored = redis.call('HGETALL', marks)
local mark = {}
for i = 1, #stored, 2 do
  mark[stored[i]] = tonumber(stored[i + 1])
end

local function is_total(field)
  local kind = string.match(field, '^(%a+):')
  return kind == nil or kind == 'hd' or kind == 'hl'
end

local out, seen, changed = {}, {}, {}
local function show(field, value)
  local offset = mark['o:' .. field] or 0
  local last = mark['x:' .. field] or 0
  local figure = value + offset
  if figure < last then
    offset = offset + last - figure
    figure = last
    changed[#changed + 1] = 'o:' .. field
    changed[#changed + 1] = offset
  end
  if figure ~= last or mark['x:' .. field] == nil then
    changed[#changed + 1] = 'x:' .. field
    changed[#changed + 1] = figure
  end
  out[#out + 1] = field
  out[#out + 1] = figure
end

for i = 1, #raw, 2 do
  local field = raw[i]
  if is_total(field) then
    seen[field] = true
    show(field, tonumber(raw[i + 1]) or 0)
  else
    out[#out + 1] = field
    out[#out + 1] = raw[i + 1]
  end
end
for i = 1, #stored, 2 do
  local field = string.match(stored[i], '^x:(.+)$')
  if field and not seen[field] then
    show(field, 0)
  end
end

local began = mark['t']
if began == nil then
  began = now_ms()
  changed[#changed + 1] = 't'
  changed[#changed + 1] = began
end
if #changed > 0 then
  redis.call('HSET', marks, unpack(changed))
end
return {began, out}
