#!lua
-- Rebuild after a loss of hot state: puts orders read back from the system of record into a
-- warm sale (mirrors SaleBook::restore_order): the order, its request (replay), the buyer's
-- units when it is live, its hold when it is RESERVED. An order already present is skipped,
-- so a chunk can be sent again. Counters are not touched (warm set them). Warm the sale
-- paused, restore every chunk, then set its state, so no purchase is judged half-restored.
-- KEYS: 1 sale, 2 buyers, 3 requests, 4 orders, 5 holds (all tagged {<sku>})
-- ARGV: n, then n times: order_no, user_id, request_id, quantity, status, deadline_ms,
--       created_at_ms
-- Returns the number of orders added. Error replies: 'INVALID_ARGS', 'NOT_WARMED'.
if #KEYS ~= 5 then return redis.error_reply('INVALID_ARGS restore_orders needs 5 keys') end
local K_SALE, K_BUYERS, K_REQUESTS, K_ORDERS, K_HOLDS = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local n = tonumber(ARGV[1])
if not (ARGV[1] and string.match(ARGV[1], '^[1-9]%d?%d?%d?$')) or n > 1024
    or #ARGV ~= 1 + 7 * n then
  return redis.error_reply('INVALID_ARGS restore_orders needs n in 1..1024 and 7n fields')
end
local sku = redis.call('HGET', K_SALE, 'sku')
if not sku then return redis.error_reply('NOT_WARMED sale is not in the hot ledger') end

local live = { PENDING = true, CREATED = true, RESERVED = true, PAID = true }
local known = { CANCELLED = true, EXPIRED = true, REJECTED = true }

-- Every check first.
local todo = {}
for i = 1, n do
  local b = 1 + 7 * (i - 1)
  local no, user, rid, qs, status, dl, created =
    ARGV[b + 1], ARGV[b + 2], ARGV[b + 3], ARGV[b + 4], ARGV[b + 5], ARGV[b + 6], ARGV[b + 7]
  local ok = string.match(no, '^%d+%-%d+%-%d+$') and string.match(no, '^(%d+)%-') == sku
    and string.match(user, '^%d+$') and #user <= 20
    and #rid >= 1 and #rid <= 64 and not string.find(rid, '[^%w_%-]')
    and string.match(qs, '^[1-9]%d?%d?%d?$') and (live[status] or known[status])
    and string.match(dl, '^%-?%d+$') and string.match(created, '^%-?%d+$')
  if not ok then return redis.error_reply('INVALID_ARGS order ' .. i .. ' is malformed') end
  if redis.call('HEXISTS', K_ORDERS, no) == 0 then
    todo[#todo + 1] = { no, user, rid, qs, status, dl, created }
  end
end

-- The writes.
for _, o in ipairs(todo) do
  local no, user, rid, qs, status, dl, created = unpack(o)
  redis.call('HSET', K_ORDERS, no, table.concat({ user, rid, qs, status, dl, created }, ':'))
  redis.call('HSET', K_REQUESTS, user .. ':' .. rid, no)
  if live[status] then redis.call('HINCRBY', K_BUYERS, user, qs) end
  if status == 'RESERVED' then redis.call('ZADD', K_HOLDS, dl, no) end
end
return #todo
