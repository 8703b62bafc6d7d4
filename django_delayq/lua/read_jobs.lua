-- Read job hashes for the model mirror, with the position of their shard's events stream
-- at the same instant (on a Cluster; elsewhere Commands.read_jobs sends MULTI/EXEC, which
-- costs Redis about a third of this script's time). Every change to a job adds its event
-- in the script that makes it, so the hashes hold the jobs' state once every entry up to
-- that position was written, and none after: a row written from them carries that
-- position, and a write of an older one never replaces it.
--
-- KEYS[1] events stream of the shard
-- KEYS[2..] job hashes (of that shard)
--
-- No ARGV.
--
-- Returns { position, job, ... }: position is the id of the stream's newest entry ('' when
-- the stream is empty); each job is its hash as HGETALL returns it (empty: no such job),
-- or the type of a key that is not a hash ('string', 'list', ...).

local out = { '' }
local newest = redis.call('XREVRANGE', KEYS[1], '+', '-', 'COUNT', 1)
if newest[1] then
  out[1] = newest[1][1]
end
for i = 2, #KEYS do
  local fields = redis.pcall('HGETALL', KEYS[i])
  if fields.err then
    out[i] = redis.call('TYPE', KEYS[i]).ok
  else
    out[i] = fields
  end
end
return out
