-- Expires at most ARGV[1] holds whose deadline is at or before now, oldest first (by deadline,
-- then order_no); mirrors SaleBook::expire_due. Each: reserved -> available, the user's quota
-- comes back, status EXPIRED, one 'expired' event.
-- KEYS: 1 sale, 2 buyers, 3 orders, 4 holds, 5 events, 6 rec, 7 seqs (all tagged {<sku>}); a
--       copy of layout 1 uses 2 and 3, one of layout 2 (records.lua) 6 and 7.
-- ARGV: 1 max (1..10000)
-- Returns {expired, restocked (1 when available came back from 0)}; {0, 0} while fenced.
-- Error replies: 'INVALID_ARGS', 'NOT_WARMED', 'CORRUPT'.
if #KEYS ~= 7 or #ARGV ~= 1 then
  return redis.error_reply('INVALID_ARGS expire_due needs 7 keys and 1 arg')
end
local K_SALE, K_BUYERS, K_ORDERS, K_HOLDS, K_EVENTS, K_REC, K_SEQS =
  KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6], KEYS[7]
if not string.match(ARGV[1], '^[1-9]%d?%d?%d?%d?$') or tonumber(ARGV[1]) > 10000 then
  return redis.error_reply('INVALID_ARGS max must be 1..10000')
end
local max = tonumber(ARGV[1])

local function int(n) return string.format('%d', n) end

local f = redis.call('HMGET', K_SALE, 'available', 'reserved', 'sold', 'seq', 'sku', 'epoch',
  'fenced_at_ms', 'buckets', 'layout', 'mode', 'timeout_ms')
if not f[1] then return redis.error_reply('NOT_WARMED sale is not in the hot ledger') end
local records = f[9] == '2'
-- A fenced copy changes nothing: its replacement expires the holds it restores.
if f[7] or moved(K_SALE) then return { 0, 0 } end
-- The entries' format version (codec.rs): 2 for a bucket of a sale of several, else 1.
local entry_v = f[8] and '2' or '1'
local available, reserved, sold, seq, sku, epoch =
  tonumber(f[1]), tonumber(f[2]), tonumber(f[3]), tonumber(f[4]), f[5], f[6]
if not (available and reserved and sold and seq and sku and epoch) then
  return redis.error_reply('CORRUPT sale hash is incomplete')
end

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local due = redis.call('ZRANGEBYSCORE', K_HOLDS, '-inf', int(now), 'LIMIT', '0', int(max))

-- Layout 2: the buyers' orders read once per buyer (parsed), and those to write back.
local rec_of, rec_changed = {}, {}
-- A due order as layout 1 encodes it, and for layout 2 its place in its buyer's record.
local function due_order(order_no)
  if not records then return redis.call('HGET', K_ORDERS, order_no) end
  local o_epoch, o_seq = string.match(order_no, '^%d+%-(%d+)%-(%d+)$')
  local u, at = rec_batch_of(K_SEQS, o_seq or '-1')
  if not u then return nil end
  if not rec_of[u] then rec_of[u] = rec_orders(redis.call('HGET', K_REC, u)) end
  local o = rec_find(rec_of[u], o_epoch, o_seq)
  if not o then return nil end
  return rec_encode(u, o, at, f[10], tonumber(f[11] or '0')), o
end

-- Every check first: decode each due order, and make sure the counters can take it back.
local expire, stale = {}, {}
local held, take_back = {}, 0
for _, order_no in ipairs(due) do
  local encoded, o = due_order(order_no)
  local u, rid, qs, status, dl, created
  if encoded then
    u, rid, qs, status, dl, created =
      string.match(encoded, '^(%d+):([%w_%-]+):(%d+):(%u+):(%-?%d+):(%-?%d+)$')
  end
  if status == 'RESERVED' then
    local q = tonumber(qs)
    if held[u] == nil then
      -- Layout 2 derives a buyer's units from its orders: only the sale's counters to check.
      held[u] = records and math.huge
        or tonumber(redis.call('HGET', K_BUYERS, u) or '0') or 0
    end
    held[u] = held[u] - q
    take_back = take_back + q
    if held[u] < 0 or take_back > reserved then
      return redis.error_reply('CORRUPT counters cannot take back ' .. order_no)
    end
    expire[#expire + 1] = { order_no, u, rid, qs, dl, created, o }
  else
    -- A hold whose order is gone or resolved: nothing to give back, only drop the hold.
    stale[#stale + 1] = order_no
  end
end

-- The writes.
local restocked = 0
if #expire > 0 and available == 0 then restocked = 1 end
for _, e in ipairs(expire) do
  local order_no, u, rid, qs = e[1], e[2], e[3], e[4]
  local q = tonumber(qs)
  seq = seq + 1
  reserved = reserved - q
  available = available + q
  if records then
    e[7].st = REC_LETTER.EXPIRED
    rec_changed[u] = true
  else
    redis.call('HSET', K_ORDERS, order_no,
      u .. ':' .. rid .. ':' .. qs .. ':EXPIRED:' .. e[5] .. ':' .. e[6])
  end
  -- 'v': the entry's format version, so a reader that cannot read it waits on it.
  redis.call('XADD', K_EVENTS, '*', 'v', entry_v, 'sku_id', sku, 'epoch', epoch, 'seq', int(seq),
    'kind', 'expired',
    'order_no', order_no, 'request_id', rid, 'user_id', u, 'quantity', qs,
    'at_ms', int(now), 'deadline_ms', '0')
  redis.call('ZREM', K_HOLDS, order_no)
end
for u in pairs(rec_changed) do redis.call('HSET', K_REC, u, rec_join(rec_of[u])) end
-- Layout 2 derives a buyer's units from its orders (the records above); layout 1 writes them.
for u, h in pairs(records and {} or held) do
  if h > 0 then
    redis.call('HSET', K_BUYERS, u, int(h))
  else
    redis.call('HDEL', K_BUYERS, u)
  end
end
for _, order_no in ipairs(stale) do redis.call('ZREM', K_HOLDS, order_no) end
if #expire > 0 then
  redis.call('HSET', K_SALE, 'available', int(available), 'reserved', int(reserved),
    'seq', int(seq))
end
return { #expire, restocked }
