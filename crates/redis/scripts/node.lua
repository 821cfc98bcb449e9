-- Prelude of the scripts that write a sale's copy or stamp it (scripts.rs puts it after the
-- shebang). A copy remembers the node it was loaded and opened on (`node`: the server
-- process's run_id). On another process -- a replica promoted by a failover, or a node
-- restarted (without what it had acknowledged, or with an AOF that may lack its last second)
-- -- the copy may lack purchases it answered and must not hand out their order numbers
-- again: `moved` fences it, dated 0, so the reconciler takes it for a stalled rebuild and
-- rebuilds it at once. The run_id, not the replication id: a primary changes its
-- replication id when its first replica attaches (it creates its backlog), which is no move.
local function node_id()
  local info = redis.call('INFO', 'server')
  local at = string.find(info, 'run_id:', 1, true)
  return at and string.sub(info, at + 7, at + 46)
end
local function moved(k_sale)
  local opened_on = redis.call('HGET', k_sale, 'node')
  if not opened_on or opened_on == node_id() then return false end
  redis.call('HSET', k_sale, 'fenced_at_ms', '0')
  return true
end
