-- The out side of a transfer of stock between two buckets of a sale (docs/DESIGN.md, "Stock
-- buckets"): lowers this bucket's available and its own total by `units` and records the
-- transfer as pending (`xout`: id -> `<to>:<units>`), with a `transfer_out` event in the same
-- stream as the bucket's purchases, all in one step. The units are then in flight, counted by
-- no bucket, until transfer_in.lua takes them in at the destination; a carrier that dies in
-- between leaves the pending record, and a recovery finishes it.
-- Transfers take no seq: seqs number the order events (an order number is
-- <sku>-<epoch>-<seq>); a transfer is named by its id `<epoch>.<xseq>`, unique in the sale
-- because no two buckets share an epoch.
-- KEYS: 1 sale, 2 events, 3 xout (all of the source bucket)
-- ARGV: 1 to (destination bucket), 2 units
-- Returns {'OK', id} or {'X', 'SHORT' | 'UNAVAILABLE'} (nothing changed).
-- Error replies: 'INVALID_ARGS', 'NOT_WARMED', 'CORRUPT'.
if #KEYS ~= 3 or #ARGV ~= 2 then
  return redis.error_reply('INVALID_ARGS transfer_out needs 3 keys and 2 args')
end
local K_SALE, K_EVENTS, K_XOUT = KEYS[1], KEYS[2], KEYS[3]
if not (string.match(ARGV[1], '^[1-9]?%d$')
    and string.match(ARGV[2], '^[1-9]%d?%d?%d?%d?%d?%d?%d?%d?$')) then
  return redis.error_reply('INVALID_ARGS to must be a bucket and units 1..=999999999')
end
local to, units = ARGV[1], tonumber(ARGV[2])
local f = redis.call('HMGET', K_SALE, 'total', 'available', 'epoch', 'sku', 'xseq',
  'fenced_at_ms', 'buckets')
if not f[1] then return redis.error_reply('NOT_WARMED sale is not in the hot ledger') end
local total, available, epoch, sku = tonumber(f[1]), tonumber(f[2]), f[3], f[4]
local xseq = tonumber(f[5] or '0')
if not (total and available and epoch and sku and xseq) then
  return redis.error_reply('CORRUPT sale hash is incomplete')
end
-- Only between buckets of a bucketed sale, never to the bucket itself (epoch % n).
local n = tonumber(f[7] or '1')
if n < 2 or tonumber(to) >= n or tonumber(to) == tonumber(epoch) % n then
  return redis.error_reply('INVALID_ARGS to is not another bucket of the sale')
end
if f[6] or moved(K_SALE) then return { 'X', 'UNAVAILABLE' } end
if available < units then return { 'X', 'SHORT' } end

local function int(n) return string.format('%d', n) end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
xseq = xseq + 1
local id = epoch .. '.' .. int(xseq)
redis.call('HSET', K_SALE, 'total', int(total - units), 'available', int(available - units),
  'xseq', int(xseq))
redis.call('HSET', K_XOUT, id, to .. ':' .. ARGV[2])
-- 'v' 2 (codec.rs): entries of a bucketed sale, which a reader from before buckets waits on.
redis.call('XADD', K_EVENTS, '*', 'v', '2', 'sku_id', sku, 'epoch', epoch,
  'kind', 'transfer_out', 'transfer_id', id, 'to', to, 'units', ARGV[2], 'at_ms', int(now))
return { 'OK', id }
