-- Keep a finished-jobs ZSET to ids younger than ttl_ms and at most keep entries.
local function trim_finished(set_key, now, ttl_ms, keep)
  if ttl_ms > 0 then
    redis.call('ZREMRANGEBYSCORE', set_key, '-inf', '(' .. (now - ttl_ms))
  end
  if keep >= 0 then
    local extra = redis.call('ZCARD', set_key) - keep
    if extra > 0 then
      redis.call('ZREMRANGEBYRANK', set_key, 0, extra - 1)
    end
  end
end
