-- The in side of a transfer (see transfer_out.lua): raises this bucket's total and available
-- by the units that left the source, records the id (`xin`) and writes a `transfer_in` event,
-- in one step. Applying one id twice counts once, so a carrier or a recovery may repeat it.
-- A fenced copy takes nothing in: the units stay in flight, recorded at the source, until
-- the copy is open again.
-- KEYS: 1 sale, 2 events, 3 xin (all of the destination bucket)
-- ARGV: 1 transfer id, 2 from (source bucket), 3 units
-- Returns 'OK' (taken in now), 'R' (taken in before: nothing changed), 'S' (taken in before
-- and stored in the database: this copy was loaded with it) or 'UNAVAILABLE'.
-- Error replies: 'INVALID_ARGS', 'NOT_WARMED', 'CORRUPT'.
if #KEYS ~= 3 or #ARGV ~= 3 then
  return redis.error_reply('INVALID_ARGS transfer_in needs 3 keys and 3 args')
end
local K_SALE, K_EVENTS, K_XIN = KEYS[1], KEYS[2], KEYS[3]
local id, from = ARGV[1], ARGV[2]
if not (string.match(id, '^[1-9]%d*%.[1-9]%d*$') and #id <= 40
    and string.match(from, '^[1-9]?%d$')
    and string.match(ARGV[3], '^[1-9]%d?%d?%d?%d?%d?%d?%d?%d?$')) then
  return redis.error_reply('INVALID_ARGS bad transfer id, bucket or units')
end
local units = tonumber(ARGV[3])
local had = redis.call('HGET', K_XIN, id)
if had then
  if had == 'restored' then return 'S' end
  return 'R'
end
local f = redis.call('HMGET', K_SALE, 'total', 'available', 'epoch', 'sku', 'fenced_at_ms',
  'buckets')
if not f[1] then return redis.error_reply('NOT_WARMED sale is not in the hot ledger') end
local total, available, epoch, sku = tonumber(f[1]), tonumber(f[2]), f[3], f[4]
if not (total and available and epoch and sku) then
  return redis.error_reply('CORRUPT sale hash is incomplete')
end
-- Only from another bucket of a bucketed sale: the id's epoch names its source (epoch % n).
local n = tonumber(f[6] or '1')
local id_epoch = tonumber(string.match(id, '^(%d+)%.'))
if n < 2 or tonumber(from) >= n or tonumber(from) == tonumber(epoch) % n
    or id_epoch % n ~= tonumber(from) then
  return redis.error_reply('INVALID_ARGS from is not another bucket of the sale')
end
if total + units > 1000000000 then
  return redis.error_reply('INVALID_ARGS a bucket holds at most 10^9 units')
end
if f[5] or moved(K_SALE) then return 'UNAVAILABLE' end

local function int(n) return string.format('%d', n) end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('HSET', K_SALE, 'total', int(total + units), 'available', int(available + units))
redis.call('HSET', K_XIN, id, ARGV[3])
redis.call('XADD', K_EVENTS, '*', 'v', '1', 'sku_id', sku, 'epoch', epoch,
  'kind', 'transfer_in', 'transfer_id', id, 'from', from, 'units', ARGV[3], 'at_ms', int(now))
return 'OK'
