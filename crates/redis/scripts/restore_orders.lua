-- Rebuild after a loss of hot state: puts orders read back from the system of record into a
-- warm sale (mirrors SaleBook::restore_order): the order, its request (replay), the buyer's
-- units when it is live, its hold when it is RESERVED. An order already present is skipped,
-- so a chunk can be sent again. Counters are not touched (load set them). Only into the
-- fenced copy of the given epoch (load.lua) on the node that loaded it, so no purchase is
-- judged half-restored, a rebuild that lost a race cannot write into the winner's copy, and a
-- failover midway (the new primary may lack earlier chunks) makes the rebuild start over.
-- A copy of layout 2 (records.lua) takes each order into its buyer's record (with its deadline
-- when the sale's timeout does not give it), a batch of one in `seqs` (its buyer and creation
-- time), and counts it as accepted.
-- KEYS: 1 sale, 2 buyers, 3 requests, 4 orders, 5 holds, 6 rec, 7 seqs (all tagged {<sku>})
-- ARGV: epoch, n, then n times: order_no, user_id, request_id, quantity, status,
--       deadline_ms, created_at_ms
-- Returns the number of orders added, or -1 when the copy is not the fenced one of epoch on
-- this node.
-- Error replies: 'INVALID_ARGS', 'NOT_WARMED'.
if #KEYS ~= 7 then return redis.error_reply('INVALID_ARGS restore_orders needs 7 keys') end
local K_SALE, K_BUYERS, K_REQUESTS, K_ORDERS, K_HOLDS, K_REC, K_SEQS =
  KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6], KEYS[7]
local epoch = ARGV[1]
local n = tonumber(ARGV[2])
if not (ARGV[2] and string.match(ARGV[2], '^[1-9]%d?%d?%d?$')) or n > 1024
    or #ARGV ~= 2 + 7 * n or not string.match(epoch or '', '^[1-9]%d*$') then
  return redis.error_reply('INVALID_ARGS restore_orders needs an epoch, n in 1..1024 and 7n fields')
end
local head = redis.call('HMGET', K_SALE, 'sku', 'epoch', 'fenced_at_ms', 'layout', 'mode',
  'timeout_ms', 'accepted')
local sku = head[1]
if not sku then return redis.error_reply('NOT_WARMED sale is not in the hot ledger') end
if head[2] ~= epoch or not head[3] or moved(K_SALE) then return -1 end
local records = head[4] == '2'
-- Layout 2: each buyer's orders, read once.
local rec_of = {}
local function orders_of(user)
  if not rec_of[user] then rec_of[user] = rec_orders(redis.call('HGET', K_REC, user)) end
  return rec_of[user]
end
local function present(no, user)
  if not records then return redis.call('HEXISTS', K_ORDERS, no) == 1 end
  local o_epoch, o_seq = string.match(no, '^%d+%-(%d+)%-(%d+)$')
  return rec_find(orders_of(user), o_epoch, o_seq) ~= nil
end

local live = { PENDING = true, CREATED = true, RESERVED = true, PAID = true }
local known = { CANCELLED = true, EXPIRED = true, REJECTED = true }

-- Every check first.
local todo = {}
for i = 1, n do
  local b = 2 + 7 * (i - 1)
  local no, user, rid, qs, status, dl, created =
    ARGV[b + 1], ARGV[b + 2], ARGV[b + 3], ARGV[b + 4], ARGV[b + 5], ARGV[b + 6], ARGV[b + 7]
  local ok = string.match(no, '^%d+%-%d+%-%d+$') and string.match(no, '^(%d+)%-') == sku
    and string.match(user, '^%d+$') and #user <= 20
    and #rid >= 1 and #rid <= 64 and not string.find(rid, '[^%w_%-]')
    and string.match(qs, '^[1-9]%d?%d?%d?$') and (live[status] or known[status])
    and string.match(dl, '^%-?%d+$') and string.match(created, '^%-?%d+$')
  if not ok then return redis.error_reply('INVALID_ARGS order ' .. i .. ' is malformed') end
  if not present(no, user) then
    todo[#todo + 1] = { no, user, rid, qs, status, dl, created }
  end
end

-- The writes.
local function restore_hashes(no, user, rid, qs, status, dl, created)
  redis.call('HSET', K_ORDERS, no, table.concat({ user, rid, qs, status, dl, created }, ':'))
  redis.call('HSET', K_REQUESTS, user .. ':' .. rid, no)
  if live[status] then redis.call('HINCRBY', K_BUYERS, user, qs) end
end
local function restore_record(no, user, rid, qs, status, dl, created)
  local o_epoch, o_seq = string.match(no, '^%d+%-(%d+)%-(%d+)$')
  local derived = (head[5] == 'reserve')
    and string.format('%d', tonumber(created) + tonumber(head[6] or '0')) or '0'
  local orders = orders_of(user)
  orders[#orders + 1] = { rid = rid, epoch = o_epoch, seq = o_seq, q = qs,
    st = REC_LETTER[status], dl = (dl == derived) and '' or dl }
  redis.call('ZADD', K_SEQS, o_seq, o_seq .. ':' .. created .. ':' .. user)
end
local written = {}
for _, o in ipairs(todo) do
  local no, user, rid, qs, status, dl, created = unpack(o)
  if records then
    restore_record(no, user, rid, qs, status, dl, created)
    written[user] = true
  else
    restore_hashes(no, user, rid, qs, status, dl, created)
  end
  if status == 'RESERVED' then redis.call('ZADD', K_HOLDS, dl, no) end
end
for user in pairs(written) do redis.call('HSET', K_REC, user, rec_join(rec_of[user])) end
if records and #todo > 0 then
  redis.call('HSET', K_SALE, 'accepted', string.format('%d', tonumber(head[7] or '0') + #todo))
end
return #todo
