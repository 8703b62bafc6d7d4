-- Raise a stored time to the Redis time now (the workflow benchmark: when the last member
-- of a group ended, when its callback started).
--
-- KEYS[1] time  STRING  the latest Redis time any caller noted, in microseconds
--
-- Returns the Redis time now, in microseconds.
local t = redis.call('TIME')
local us = tonumber(t[1]) * 1000000 + tonumber(t[2])
local old = tonumber(redis.call('GET', KEYS[1]) or '0')
if us > old then redis.call('SET', KEYS[1], us) end
return us
