-- An order as the copy knows it (also while PENDING), for the order route and the reconciler:
-- layout 1 keeps it in the `orders` hash; layout 2 in its buyer's record (records.lua), found
-- through the batch that took its seq. Reads only.
-- KEYS: 1 sale, 2 orders, 3 rec, 4 seqs (all tagged {<sku>}). ARGV: 1 order_no
-- Returns the order encoded as layout 1 does (user:request_id:quantity:status:deadline_ms:
-- created_at_ms), or nil when the copy does not hold it.
-- Error reply: 'INVALID_ARGS'.
if #KEYS ~= 4 or #ARGV ~= 1 then
  return redis.error_reply('INVALID_ARGS order needs 4 keys and 1 arg')
end
local K_SALE, K_ORDERS, K_REC, K_SEQS = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local order_no = ARGV[1]
local o_epoch, o_seq = string.match(order_no, '^%d+%-(%d+)%-(%d+)$')
if not o_epoch or #order_no > 64 then
  return redis.error_reply('INVALID_ARGS bad order_no')
end
local f = redis.call('HMGET', K_SALE, 'layout', 'mode', 'timeout_ms')
if f[1] ~= '2' then return redis.call('HGET', K_ORDERS, order_no) end
local user, at = rec_batch_of(K_SEQS, o_seq)
if not user then return nil end
local o = rec_find(rec_orders(redis.call('HGET', K_REC, user)), o_epoch, o_seq)
if not o then return nil end
return rec_encode(user, o, at, f[2], tonumber(f[3] or '0'))
