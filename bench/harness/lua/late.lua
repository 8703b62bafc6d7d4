-- Record how late a delayed job started, on the Redis clock.
--
-- KEYS[1] late list  LIST  start - due of each job, in microseconds
-- ARGV[1] due time, seconds of the epoch
-- ARGV[2] due time, microseconds within that second
--
-- Returns start - due in microseconds (negative: the job started early).
local t = redis.call('TIME')
local d = (tonumber(t[1]) - tonumber(ARGV[1])) * 1000000 + (tonumber(t[2]) - tonumber(ARGV[2]))
redis.call('RPUSH', KEYS[1], d)
return d
