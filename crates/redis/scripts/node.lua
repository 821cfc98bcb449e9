-- Prelude of the scripts that write a sale's copy or stamp it (scripts.rs puts it after the
-- shebang). A copy remembers the node it was loaded and opened on (`node`: the server
-- process's run_id). On another process -- a replica promoted by a failover, or a node
-- restarted (without what it had acknowledged, or with an AOF that may lack its last second)
-- -- the copy may lack purchases it answered and must not hand out their order numbers
-- again: `moved` fences it, dated 0, so the reconciler takes it for a stalled rebuild and
-- rebuilds it at once. The node is its run_id and its replication id (`<run_id>/<replid>`).
-- The run_id alone misses a node that came back as itself with another's data: a primary cut
-- off with a minority keeps selling (and its persister may store what it sold), its replica
-- is promoted, the old primary rejoins as that replica's replica and takes its data, and is
-- promoted back -- the same run_id, a copy without what it sold alone. Every promotion gives a
-- node a new replication id and keeps the one it followed as `master_replid2`. A primary also
-- takes a new replication id when its first replica attaches (it creates its backlog), which
-- is no move: then it has no `master_replid2` (all zeros), and the copy stays.
-- Written out, not made by string.rep: every call of these scripts runs this prelude.
local NO_REPLID = '0000000000000000000000000000000000000000'
local function node_info()
  local info = redis.call('INFO', 'server', 'replication')
  local function field(name)
    local at = string.find(info, '\n' .. name .. ':', 1, true)
    return at and string.sub(info, at + #name + 2, at + #name + 41)
  end
  return field('run_id'), field('master_replid'), field('master_replid2')
end
local function node_id()
  local run_id, replid = node_info()
  return run_id and replid and (run_id .. '/' .. replid)
end
-- Whether a copy opened on `opened_on` (a node_id, or a bare run_id written by an older
-- version) is on another node now.
local function moved_from(opened_on)
  if not opened_on then return false end
  local run_id, replid, replid2 = node_info()
  local was_run, was_repl = string.match(opened_on, '^([^/]*)/?(.*)$')
  if was_run ~= run_id then return true end
  return was_repl ~= '' and was_repl ~= replid and replid2 ~= NO_REPLID
end
-- Whether the copy at `k_sale`, opened on `opened_on` (its `node`, read by the caller with
-- the sale's other fields), is on another node now; fenced if so.
local function moved_with(k_sale, opened_on)
  if not moved_from(opened_on) then return false end
  redis.call('HSET', k_sale, 'fenced_at_ms', '0')
  return true
end
local function moved(k_sale)
  return moved_with(k_sale, redis.call('HGET', k_sale, 'node'))
end
