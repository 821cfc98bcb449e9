-- Resolves a reservation: 'paid' moves reserved -> sold; 'cancelled' moves reserved ->
-- available and gives the user's quota back. One script for both, so they cannot drift apart.
-- Mirrors SaleBook::resolve: not the owner -> ORDER_NOT_FOUND; RESERVED and now < deadline ->
-- change; RESERVED past its deadline or EXPIRED -> HOLD_EXPIRED; already in the status asked
-- for (the owner's retry) -> the order as it is, no write; else ALREADY_RESOLVED.
-- KEYS: 1 sale, 2 buyers, 3 orders, 4 holds, 5 events, 6 rec, 7 seqs (all tagged {<sku>}); a
--       copy of layout 1 uses 2 and 3, one of layout 2 (records.lua) 6 and 7.
-- ARGV: 1 order_no, 2 user_id, 3 kind ('paid' | 'cancelled')
-- Returns {'OK', encoded_order_after, restocked (1 when available came back from 0)}
--      or {'R', encoded_order} (a retry of a resolution that went through: nothing written)
--      or {'X', CODE} (UNAVAILABLE while the copy is fenced).
-- Error replies: 'INVALID_ARGS', 'NOT_WARMED', 'CORRUPT'.
if #KEYS ~= 7 or #ARGV ~= 3 then
  return redis.error_reply('INVALID_ARGS resolve needs 7 keys and 3 args')
end
local KIND = ARGV[3]
local STATUS = ({ paid = 'PAID', cancelled = 'CANCELLED' })[KIND]
if not STATUS then
  return redis.error_reply('INVALID_ARGS kind must be paid or cancelled')
end
local K_SALE, K_BUYERS, K_ORDERS, K_HOLDS, K_EVENTS, K_REC, K_SEQS =
  KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6], KEYS[7]
-- A user id as Rust's u64 prints it: canonical decimal, at most 18446744073709551615.
local function is_user(s)
  if s == '0' then return true end
  if not string.match(s, '^[1-9]%d*$') or #s > 20 then return false end
  return #s < 20 or s <= '18446744073709551615'
end
local order_no, user = ARGV[1], ARGV[2]
if not string.match(order_no, '^%d+%-%d+%-%d+$') or #order_no > 64
    or not is_user(user) then
  return redis.error_reply('INVALID_ARGS bad order_no or user_id')
end

local function int(n) return string.format('%d', n) end

-- A fenced copy is being replaced (its orders may be half restored): the client retries.
if redis.call('HEXISTS', K_SALE, 'fenced_at_ms') == 1 or moved(K_SALE) then
  return { 'X', 'UNAVAILABLE' }
end

local layout = redis.call('HMGET', K_SALE, 'layout', 'mode', 'timeout_ms')
local records = layout[1] == '2'
-- The order as layout 1 encodes it, whichever layout holds it; for layout 2 also the
-- buyer's orders and this one among them (its record is written back with the new status).
local encoded, rec, found
if records then
  local o_epoch, o_seq = string.match(order_no, '^%d+%-(%d+)%-(%d+)$')
  rec = rec_orders(redis.call('HGET', K_REC, user))
  found = rec_find(rec, o_epoch, o_seq)
  if found then
    local _, at = rec_batch_of(K_SEQS, o_seq)
    encoded = rec_encode(user, found, at or '0', layout[2], tonumber(layout[3] or '0'))
  end
else
  encoded = redis.call('HGET', K_ORDERS, order_no)
end
if not encoded then return { 'X', 'ORDER_NOT_FOUND' } end
local o_user, o_rid, o_q, o_status, o_deadline, o_created =
  string.match(encoded, '^(%d+):([%w_%-]+):(%d+):(%u+):(%-?%d+):(%-?%d+)$')
if not o_user then return redis.error_reply('CORRUPT order ' .. order_no) end
if o_user ~= user then return { 'X', 'ORDER_NOT_FOUND' } end

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local q, deadline = tonumber(o_q), tonumber(o_deadline)
if o_status == 'RESERVED' and now >= deadline then return { 'X', 'HOLD_EXPIRED' } end
if o_status == 'EXPIRED' then return { 'X', 'HOLD_EXPIRED' } end
if o_status == STATUS then return { 'R', encoded } end
if o_status ~= 'RESERVED' then return { 'X', 'ALREADY_RESOLVED' } end

local f = redis.call('HMGET', K_SALE, 'available', 'reserved', 'sold', 'seq', 'sku', 'epoch',
  'buckets')
if not f[1] then return redis.error_reply('NOT_WARMED sale is not in the hot ledger') end
local epoch = f[6]
-- The entry's format version (codec.rs): 2 for a bucket of a sale of several, else 1.
local entry_v = f[7] and '2' or '1'
local available, reserved, sold, seq, sku =
  tonumber(f[1]), tonumber(f[2]), tonumber(f[3]), tonumber(f[4]), f[5]
if not (available and reserved and sold and seq and sku) or reserved < q then
  return redis.error_reply('CORRUPT sale counters cannot take back ' .. order_no)
end
-- Layout 2 derives the buyer's units from its orders: nothing to check or write apart.
local held = records and q or tonumber(redis.call('HGET', K_BUYERS, user) or '0') or 0
if KIND ~= 'paid' and held < q then
  return redis.error_reply('CORRUPT buyer ' .. user .. ' holds fewer units than ' .. order_no)
end

-- Every check done; the writes.
local restocked = 0
seq = seq + 1
reserved = reserved - q
if KIND == 'paid' then
  sold = sold + q
else
  if available == 0 then restocked = 1 end
  available = available + q
  if records then
    -- The record's status change below gives the units back.
  elseif held - q > 0 then
    redis.call('HSET', K_BUYERS, user, int(held - q))
  else
    redis.call('HDEL', K_BUYERS, user)
  end
end
local after = o_user .. ':' .. o_rid .. ':' .. o_q .. ':' .. STATUS .. ':' .. o_deadline .. ':'
  .. o_created
if records then
  found.st = REC_LETTER[STATUS]
  redis.call('HSET', K_REC, user, rec_join(rec))
else
  redis.call('HSET', K_ORDERS, order_no, after)
end
redis.call('ZREM', K_HOLDS, order_no)
redis.call('HSET', K_SALE, 'available', int(available), 'reserved', int(reserved),
  'sold', int(sold), 'seq', int(seq))
-- 'v': the entry's format version, so a reader that cannot read it waits on it.
redis.call('XADD', K_EVENTS, '*', 'v', entry_v, 'sku_id', sku, 'epoch', epoch, 'seq', int(seq),
  'kind', KIND, 'order_no', order_no, 'request_id', o_rid, 'user_id', o_user, 'quantity', o_q,
  'at_ms', int(now), 'deadline_ms', '0')
return { 'OK', after, restocked }
