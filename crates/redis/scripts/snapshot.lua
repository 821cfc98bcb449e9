#!lua
-- Reads, in one atomic step, a sale's hash and every entry of its events stream (for the
-- reconciler: hot counters at seq, and the events not yet trimmed).
-- KEYS: 1 sale, 2 events (both tagged {<sku>}). ARGV: none.
-- Returns {flat HGETALL of the sale, XRANGE - + of the events}; the first is empty when the
-- sale is not warm.
if #KEYS ~= 2 or #ARGV ~= 0 then
  return redis.error_reply('INVALID_ARGS snapshot needs 2 keys and no args')
end
return { redis.call('HGETALL', KEYS[1]), redis.call('XRANGE', KEYS[2], '-', '+') }
