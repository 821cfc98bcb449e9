-- Prelude of the scripts that write a sale's copy or stamp it (scripts.rs puts it after the
-- shebang). A copy remembers the node it was opened on (`node`, the node's replication id).
-- On another node -- a replica promoted by a failover, or a node restarted without what it had
-- acknowledged -- the copy may lack purchases it answered and must not hand out their order
-- numbers again: `moved` fences it, dated 0, so the reconciler takes it for a stalled rebuild
-- and rebuilds it at once.
local function node_id()
  local info = redis.call('INFO', 'replication')
  local at = string.find(info, 'master_replid:', 1, true)
  return at and string.sub(info, at + 14, at + 53)
end
local function moved(k_sale)
  local opened_on = redis.call('HGET', k_sale, 'node')
  if not opened_on or opened_on == node_id() then return false end
  redis.call('HSET', k_sale, 'fenced_at_ms', '0')
  return true
end
