#!lua
-- Judges a batch of purchases of one sale, in order; mirrors flashsale_core::SaleBook check for
-- check: replay -> state/window -> quantity -> stock -> per-user limit -> accept.
-- KEYS: 1 sale, 2 buyers, 3 requests, 4 orders, 5 holds, 6 events (all tagged {<sku>})
-- ARGV: n, then n times: user_id, request_id, quantity
-- Returns one entry per request, in order:
--   {'A', order_no, encoded_order}   accepted now
--   {'R', order_no, encoded_order}   replay of an accepted request (no change)
--   {'X', CODE}                      rejected (no change)
-- Error replies: 'NOT_WARMED' (no sale hash), 'INVALID_ARGS' (malformed call, no change).
-- Encoded order: user:request_id:quantity:status:deadline_ms:created_at_ms
local K_SALE, K_BUYERS, K_REQUESTS, K_ORDERS, K_HOLDS, K_EVENTS =
  KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6]
if #KEYS ~= 6 then
  return redis.error_reply('INVALID_ARGS purchase needs 6 keys')
end

local function int(n) return string.format('%d', n) end
-- A user id as Rust's u64 prints it: canonical decimal, at most 18446744073709551615.
local function is_user(s)
  if s == '0' then return true end
  if not string.match(s, '^[1-9]%d*$') or #s > 20 then return false end
  return #s < 20 or s <= '18446744073709551615'
end

local n = tonumber(ARGV[1])
if not (ARGV[1] and string.match(ARGV[1], '^[1-9]%d?%d?%d?$')) or n > 1024
    or #ARGV ~= 1 + 3 * n then
  return redis.error_reply('INVALID_ARGS purchase needs n in 1..1024 and 3n request fields')
end

local f = redis.call('HMGET', K_SALE, 'total', 'available', 'reserved', 'sold', 'seq',
  'epoch', 'limit', 'mode', 'timeout_ms', 'starts_at_ms', 'ends_at_ms', 'state', 'sku')
if not f[1] then
  return redis.error_reply('NOT_WARMED sale is not in the hot ledger')
end
local total, available, reserved, sold, seq = tonumber(f[1]), tonumber(f[2]),
  tonumber(f[3]), tonumber(f[4]), tonumber(f[5])
local epoch, limit, mode, timeout_ms = f[6], tonumber(f[7]), f[8], tonumber(f[9])
local starts_at, ends_at, state, sku = tonumber(f[10]), tonumber(f[11]), f[12], f[13]
if not (total and available and reserved and sold and seq and limit and timeout_ms
    and starts_at and ends_at and epoch and sku and state)
    or (mode ~= 'direct' and mode ~= 'reserve') then
  return redis.error_reply('CORRUPT sale hash is incomplete')
end

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)

local function judge_window()
  if state == 'scheduled' then return 'NOT_STARTED' end
  if state == 'paused' then return 'PAUSED' end
  if state == 'ended' then return 'ENDED' end
  if state ~= 'live' then return 'NOT_STARTED' end
  if now < starts_at then return 'NOT_STARTED' end
  if now >= ends_at then return 'ENDED' end
  return nil
end
local window = judge_window()

-- Batch-local caches: the buyers read once per user, the requests accepted in this batch.
local held_cache, dirty_users, dirty_list = {}, {}, {}
local accepted_now = {}
local function held(user)
  local h = held_cache[user]
  if h == nil then
    h = tonumber(redis.call('HGET', K_BUYERS, user) or '0') or 0
    held_cache[user] = h
  end
  return h
end

local status_new = (mode == 'reserve') and 'RESERVED' or 'CREATED'
local changed = false
local out = {}

for i = 1, n do
  local user, rid, qs = ARGV[3 * i - 1], ARGV[3 * i], ARGV[3 * i + 1]
  local result
  if not is_user(user) or #rid < 1 or #rid > 64 or string.find(rid, '[^%w_%-]') then
    result = { 'X', 'INVALID_REQUEST' }
  else
    local rkey = user .. ':' .. rid
    local prior = accepted_now[rkey]
    if prior == nil then prior = redis.call('HGET', K_REQUESTS, rkey) end
    if prior then
      result = { 'R', prior, redis.call('HGET', K_ORDERS, prior) or '' }
    elseif window then
      result = { 'X', window }
    elseif not string.match(qs, '^[1-9]%d*$') then
      result = { 'X', 'INVALID_REQUEST' }
    elseif #qs > 12 or tonumber(qs) > limit then
      result = { 'X', 'LIMIT_EXCEEDED' }
    else
      local q = tonumber(qs)
      if available < q then
        result = { 'X', 'SOLD_OUT' }
      elseif held(user) + q > limit then
        result = { 'X', 'LIMIT_EXCEEDED' }
      else
        -- Accept: every check for this request is done; now its writes.
        seq = seq + 1
        available = available - q
        local deadline = 0
        if mode == 'reserve' then
          reserved = reserved + q
          deadline = now + timeout_ms
        else
          sold = sold + q
        end
        local order_no = sku .. '-' .. epoch .. '-' .. int(seq)
        local encoded = user .. ':' .. rid .. ':' .. int(q) .. ':' .. status_new .. ':'
          .. int(deadline) .. ':' .. int(now)
        held_cache[user] = held(user) + q
        if not dirty_users[user] then
          dirty_users[user] = true
          dirty_list[#dirty_list + 1] = user
        end
        accepted_now[rkey] = order_no
        redis.call('HSET', K_REQUESTS, rkey, order_no)
        redis.call('HSET', K_ORDERS, order_no, encoded)
        if mode == 'reserve' then
          redis.call('ZADD', K_HOLDS, int(deadline), order_no)
        end
        redis.call('XADD', K_EVENTS, '*', 'sku_id', sku, 'seq', int(seq), 'kind', 'deducted',
          'order_no', order_no, 'request_id', rid, 'user_id', user, 'quantity', int(q),
          'at_ms', int(now), 'deadline_ms', int(deadline))
        changed = true
        result = { 'A', order_no, encoded }
      end
    end
  end
  out[i] = result
end

if changed then
  local args = {}
  for _, user in ipairs(dirty_list) do
    args[#args + 1] = user
    args[#args + 1] = int(held_cache[user])
  end
  redis.call('HSET', K_BUYERS, unpack(args))
  redis.call('HSET', K_SALE, 'available', int(available), 'reserved', int(reserved),
    'sold', int(sold), 'seq', int(seq))
end
return out
