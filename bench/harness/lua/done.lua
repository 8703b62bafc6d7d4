-- Count the no-op jobs a worker process finished since its last report, and stamp the
-- moments the measured window is read from.
--
-- KEYS[1] count      STRING  jobs finished so far, every process together
-- KEYS[2] first      STRING  mark of the report that passed job 1
-- KEYS[3] last       STRING  mark of the report that passed job n
-- KEYS[4] window lo  STRING  mark of the report that passed job lo
-- KEYS[5] window hi  STRING  mark of the report that passed job hi
-- KEYS[6] firsts     HASH    pid -> mark of that process's first report
-- ARGV[1] pid of the reporting process
-- ARGV[2] 1 on that process's first report, else 0
-- ARGV[3] jobs it finished since its last report
-- ARGV[4..6] the counts lo, hi and n
--
-- A mark is "count seconds.micros": the count reached and the Redis time (Lua's number
-- formatting would round a microsecond epoch). Returns the count.
local d = tonumber(ARGV[3])
local c = redis.call('INCRBY', KEYS[1], d)
local b = c - d
local lo, hi, n = tonumber(ARGV[4]), tonumber(ARGV[5]), tonumber(ARGV[6])
local function passed(x) return b < x and x <= c end
local first_here = ARGV[2] == '1'
if passed(1) or passed(lo) or passed(hi) or passed(n) or first_here then
  local t = redis.call('TIME')
  local mark = c .. ' ' .. t[1] .. '.' .. string.format('%06d', tonumber(t[2]))
  if passed(1) then redis.call('SET', KEYS[2], mark) end
  if passed(n) then redis.call('SET', KEYS[3], mark) end
  if passed(lo) then redis.call('SET', KEYS[4], mark) end
  if passed(hi) then redis.call('SET', KEYS[5], mark) end
  if first_here then redis.call('HSETNX', KEYS[6], ARGV[1], mark) end
end
return c
