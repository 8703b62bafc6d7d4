-- Give a finished job hash its time to live; 0 deletes it at once.
local function expire_finished(job_key, ttl_ms)
  if ttl_ms > 0 then
    redis.call('PEXPIRE', job_key, ttl_ms)
  else
    redis.call('DEL', job_key)
  end
end
