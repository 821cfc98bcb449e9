-- Reads, in one atomic step, a sale's hash and every entry of its events stream (for the
-- reconciler and rebuilds: hot counters at seq, and the events not yet trimmed), and how
-- long the copy has been fenced.
-- KEYS: 1 sale, 2 events (both tagged {<sku>}). ARGV: none.
-- Returns {flat HGETALL of the sale, XRANGE - + of the events, fenced ms or -1}; the first
-- is empty when the sale has no hot copy.
if #KEYS ~= 2 or #ARGV ~= 0 then
  return redis.error_reply('INVALID_ARGS snapshot needs 2 keys and no args')
end
local fenced = -1
local at = tonumber(redis.call('HGET', KEYS[1], 'fenced_at_ms') or '')
-- A copy opened on another node (node.lua) counts as fenced since time 0; read only here.
if not at and moved_from(redis.call('HGET', KEYS[1], 'node')) then at = 0 end
if at then
  local t = redis.call('TIME')
  fenced = math.max(0, tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000) - at)
end
return { redis.call('HGETALL', KEYS[1]), redis.call('XRANGE', KEYS[2], '-', '+'), fenced }
