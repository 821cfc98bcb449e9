-- Loads a sale into the hot ledger from the system of record as the copy of an epoch the
-- caller has just taken in the database (the fencing token). The copy starts fenced: it
-- judges nothing until open.lua. It is stamped with the node it is loaded on (node.lua):
-- restore_orders.lua and open.lua refuse it on any other node. A copy of an older epoch is replaced (the database already
-- refuses its events); a copy of this epoch or a newer one stands, and the answer is
-- 'ALREADY_WARM'. The events stream is never deleted here: the persister still reads it,
-- and the database sorts its events by epoch.
-- KEYS: 1 sale, 2 buyers, 3 requests, 4 orders, 5 holds, 6 rec, 7 seqs (all tagged {<sku>}),
--       and for a bucket: 8 xout, 9 xin (its transfers belong to its copy: a new copy starts
--       with none)
-- ARGV: 1 sku, 2 total, 3 available, 4 reserved, 5 sold, 6 seq, 7 epoch, 8 limit, 9 mode,
--       10 timeout_ms, 11 starts_at_ms, 12 ends_at_ms, 13 state, 14 layout (1: the requests,
--       orders and buyers hashes; 2: one record per buyer, records.lua),
--       and for a bucket of a sale of several: 15 buckets (2..=64), 16 salts (one per bucket,
--       comma-separated), stored with the copy so every instance finds the sale's buckets.
--       `total` is then the bucket's share, and the keys carry the bucket's tag.
-- Returns 'OK' or 'ALREADY_WARM'. Error reply 'INVALID_ARGS' (nothing changed).
if not ((#KEYS == 7 and #ARGV == 14) or (#KEYS == 9 and #ARGV == 16)) then
  return redis.error_reply('INVALID_ARGS load needs 7 keys and 14 args, or 9 and 16')
end
-- Canonical decimals below 2^53 (a Lua number holds them exactly).
local function uint(s)
  if type(s) ~= 'string' or #s > 16 or not string.match(s, '^%d+$') then return nil end
  local n = tonumber(s)
  if n > 9007199254740991 then return nil end
  return n
end
local sku, total, available, reserved, sold, seq, epoch, limit =
  uint(ARGV[1]), uint(ARGV[2]), uint(ARGV[3]), uint(ARGV[4]), uint(ARGV[5]), uint(ARGV[6]),
  uint(ARGV[7]), uint(ARGV[8])
local mode, timeout_ms, starts_at, ends_at, state =
  ARGV[9], uint(ARGV[10]), uint(ARGV[11]), uint(ARGV[12]), ARGV[13]
local function bad(why) return redis.error_reply('INVALID_ARGS load: ' .. why) end
if not (sku and total and available and reserved and sold and seq and epoch and limit
    and timeout_ms and starts_at and ends_at) then
  return bad('numbers must be integers in 0..2^53')
end
if sku < 1 or epoch < 1 then return bad('sku and epoch must be positive') end
local layout, buckets, salts = ARGV[14], ARGV[15], ARGV[16]
if layout ~= '1' and layout ~= '2' then return bad('layout must be 1 or 2') end
local salt_of = {}
if buckets then
  for salt in string.gmatch(salts, '[^,]+') do salt_of[#salt_of + 1] = salt end
  if not (string.match(buckets, '^[1-9]%d?$') and tonumber(buckets) >= 2
      and tonumber(buckets) <= 64 and string.match(salts, '^0[,%d]*%d$')
      and not string.find(salts, ',,', 1, true) and #salt_of == tonumber(buckets)) then
    return bad('buckets must be 2..=64 with a salt each, bucket 0 unsalted')
  end
end
-- A bucket may start empty (a sale of fewer units than buckets): transfers bring it stock.
if total < (buckets and 0 or 1) or total > 1000000000 then
  return bad('total must be 1..=10^9 (0..=10^9 for a bucket)')
end
if available + reserved + sold ~= total then return bad('counters not conserved') end
if limit < 1 or limit > 1000 then return bad('limit must be 1..=1000') end
if mode ~= 'direct' and mode ~= 'reserve' then return bad('mode must be direct|reserve') end
if timeout_ms > 604800000 or (mode == 'reserve' and timeout_ms < 1) then
  return bad('timeout_ms must be 1..=604800000 in reserve mode')
end
if ends_at <= starts_at then return bad('ends_at_ms must be after starts_at_ms') end
if state ~= 'scheduled' and state ~= 'live' and state ~= 'paused' and state ~= 'ended' then
  return bad('state must be scheduled|live|paused|ended')
end
-- The keys carry the sale's tag, or for bucket b = epoch % buckets `<sku>.<b>.<salt b>`.
local tag, want = string.match(KEYS[1], '{(.-)}'), ARGV[1]
if buckets then
  local b = epoch % tonumber(buckets)
  if b > 0 then want = ARGV[1] .. '.' .. b .. '.' .. salt_of[b + 1] end
end
if tag ~= want then return bad('the keys are not those of this sale (or bucket)') end

local cur_epoch = tonumber(redis.call('HGET', KEYS[1], 'epoch') or '0') or 0
if cur_epoch >= epoch then
  return 'ALREADY_WARM'
end

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('DEL', unpack(KEYS))
redis.call('HSET', KEYS[1], 'sku', ARGV[1], 'total', ARGV[2], 'available', ARGV[3],
  'reserved', ARGV[4], 'sold', ARGV[5], 'seq', ARGV[6], 'epoch', ARGV[7], 'limit', ARGV[8],
  'mode', mode, 'timeout_ms', ARGV[10], 'starts_at_ms', ARGV[11], 'ends_at_ms', ARGV[12],
  'state', state, 'fenced_at_ms', string.format('%d', now), 'node', node_id(),
  'unopened', '1')
if buckets then redis.call('HSET', KEYS[1], 'buckets', buckets, 'salts', salts) end
-- Layout 1 is a copy without the field, as every older release loads it.
if layout == '2' then redis.call('HSET', KEYS[1], 'layout', '2', 'accepted', '0') end
return 'OK'
