-- include: link_parent

-- Link waiting jobs to their parents in this shard (flows.lua): the parents in another
-- shard than their dependant's (enqueue.lua links those of the dependant's own shard),
-- or any parent again when a dependant is repaired. A parent that has not finished for
-- good records the dependant, to resolve it when it does; a parent that has is
-- reported, for the caller to resolve the dependant now (resolve.lua). Linking twice is
-- harmless (a SET).
--
-- KEYS[1] job key prefix of this shard (parent keys are KEYS[1] .. id)
--
-- ARGV per link, 2 values: parent id, dependant member ('L <index> <id>' for a dependant
--      in this shard, 'R <index> <queue> <shard or -> <id>' elsewhere)
--
-- Returns per link 2 values: 'linked' and '', or the parent's final outcome
-- ('completed', 'failed', 'cancelled'; 'missing' when it is gone) and its result JSON.

local prefix = KEYS[1]
local out = {}
for i = 1, #ARGV, 2 do
  local outcome, result = link_parent(prefix, ARGV[i], ARGV[i + 1])
  out[#out + 1] = outcome or 'linked'
  out[#out + 1] = result or ''
end
return out
