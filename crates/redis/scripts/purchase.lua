-- Judges a batch of purchases of one sale, in order; mirrors flashsale_core::SaleBook check for
-- check: replay -> state/window -> quantity -> stock -> per-user limit -> accept.
-- KEYS: 1 sale, 2 buyers, 3 requests, 4 orders, 5 holds, 6 events (all tagged {<sku>})
-- ARGV: n, then n times: user_id, request_id, quantity
-- Returns one flat array, three fields per request, in order:
--   'A', order_no, encoded_order     accepted now
--   'R', order_no, encoded_order     replay of an accepted request (no change)
--   'X', CODE, ''                    rejected (no change)
-- Error replies: 'NOT_WARMED' (no sale hash), 'INVALID_ARGS' (malformed call, no change).
-- A fenced copy (a rebuild is replacing it) answers 'X', 'UNAVAILABLE' to every new request.
-- Encoded order: user:request_id:quantity:status:deadline_ms:created_at_ms
--
-- Cost per request is what bounds a spike, so the script reads the requests hash once per
-- batch (HMGET), the buyers hash once per batch (only when something reaches the limit
-- check), and writes requests, orders, holds, buyers, counters and the events with one command
-- each at the end. Every check of the whole batch runs against batch-local copies, so all
-- reads come before the deferred writes.
--
-- The events: ONE stream entry for all deductions of the call (they share sku, epoch, kind,
-- at_ms and deadline_ms, and their seqs and order numbers are consecutive):
--   sku_id, epoch, kind=deducted, first_seq, n, at_ms, deadline_ms,
--   users, request_ids, quantities   (n values each, comma-separated, in seq order)
-- The i-th (from 0) is the event of seq first_seq + i, order number <sku>-<epoch>-<seq>.
-- Readers expand it into one event per change (codec.rs), as they read the one-event
-- entries that resolve.lua and expire_due.lua write (and older purchase.lua wrote).
--
-- `--@stage NAME` lines mark where `flashsale bench script` cuts the script short (it inserts
-- a return there) to measure what each part costs Redis per purchase.
local K_SALE, K_BUYERS, K_REQUESTS, K_ORDERS, K_HOLDS, K_EVENTS =
  KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6]
if #KEYS ~= 6 then
  return redis.error_reply('INVALID_ARGS purchase needs 6 keys')
end

local find, format = string.find, string.format
local function int(x) return format('%d', x) end

local n = tonumber(ARGV[1])
if not (ARGV[1] and find(ARGV[1], '^[1-9]%d?%d?%d?$')) or n > 1024
    or #ARGV ~= 1 + 3 * n then
  return redis.error_reply('INVALID_ARGS purchase needs n in 1..1024 and 3n request fields')
end

local f = redis.call('HMGET', K_SALE, 'total', 'available', 'reserved', 'sold', 'seq',
  'epoch', 'limit', 'mode', 'timeout_ms', 'starts_at_ms', 'ends_at_ms', 'state', 'sku',
  'fenced_at_ms', 'buckets')
if not f[1] then
  return redis.error_reply('NOT_WARMED sale is not in the hot ledger')
end
local total, available, reserved, sold, seq = tonumber(f[1]), tonumber(f[2]),
  tonumber(f[3]), tonumber(f[4]), tonumber(f[5])
local epoch, limit, mode, timeout_ms = f[6], tonumber(f[7]), f[8], tonumber(f[9])
local starts_at, ends_at, state, sku = tonumber(f[10]), tonumber(f[11]), f[12], f[13]
local fenced = f[14]
-- The entries' format version (codec.rs): a bucket of a sale of several writes version 2, which
-- a reader from before buckets waits on instead of misreading; a sale of one bucket, 1.
local entry_v = f[15] and '2' or '1'
if not fenced and moved(K_SALE) then fenced = '0' end
if not (total and available and reserved and sold and seq and limit and timeout_ms
    and starts_at and ends_at and epoch and sku and state)
    or (mode ~= 'direct' and mode ~= 'reserve') then
  return redis.error_reply('CORRUPT sale hash is incomplete')
end

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)

--@stage sale
local function judge_window()
  -- A fenced copy is being replaced: the client retries with the same request_id.
  if fenced then return 'UNAVAILABLE' end
  if state == 'scheduled' then return 'NOT_STARTED' end
  if state == 'paused' then return 'PAUSED' end
  if state == 'ended' then return 'ENDED' end
  if state ~= 'live' then return 'NOT_STARTED' end
  if now < starts_at then return 'NOT_STARTED' end
  if now >= ends_at then return 'ENDED' end
  return nil
end
local window = judge_window()

-- A user id as Rust's u64 prints it: canonical decimal, at most 18446744073709551615.
local function is_user(s)
  if s == '0' then return true end
  if #s > 20 or not find(s, '^[1-9]%d*$') then return false end
  return #s < 20 or s <= '18446744073709551615'
end
local function is_rid(s)
  return #s >= 1 and #s <= 64 and not find(s, '[^%w_%-]')
end

-- Pass 1: the request key (user:request_id) of each well-formed request, and the first
-- outcome of every one already accepted (one HMGET for the batch).
local rkeys, lookup, m = {}, {}, 0
for i = 1, n do
  local user, rid = ARGV[3 * i - 1], ARGV[3 * i]
  -- Fast path: a user id under 10^19 and a plain request id pass one pattern.
  local rkey = user .. ':' .. rid
  if (#user < 20 and #rid <= 64 and find(rkey, '^[1-9]%d*:[%w_%-]+$'))
      or (is_user(user) and is_rid(rid)) then
    rkeys[i] = rkey
    m = m + 1
    lookup[m] = rkey
  end
end
local prior_of = {}
if m > 0 then
  local found = redis.call('HMGET', K_REQUESTS, unpack(lookup))
  for j = 1, m do
    if found[j] then prior_of[lookup[j]] = found[j] end
  end
end

--@stage replays
-- Units held per user, read on first need for every user of the batch at once.
local held_of = nil
local function held(user)
  if held_of == nil then
    held_of = {}
    local users = {}
    for i = 1, n do
      if rkeys[i] then users[#users + 1] = ARGV[3 * i - 1] end
    end
    local got = redis.call('HMGET', K_BUYERS, unpack(users))
    for j = 1, #users do
      held_of[users[j]] = tonumber(got[j] or '0') or 0
    end
  end
  return held_of[user]
end

local status_new = (mode == 'reserve') and 'RESERVED' or 'CREATED'
local deadline = (mode == 'reserve') and now + timeout_ms or 0
local now_s, deadline_s = int(now), int(deadline)
local order_prefix = sku .. '-' .. epoch .. '-'
local accepted_at = {}  -- request key -> index in this batch of its acceptance
local out = {}
-- The stream entry's lists (one value per accepted request) and its first seq.
local ev_users, ev_rids, ev_qs, ev_n, first_seq = {}, {}, {}, 0, nil

-- Counts the units and the event of request i; every check for it is done.
local function accept(i, user, rid, rkey, qs, q)
  seq = seq + 1
  available = available - q
  if mode == 'reserve' then reserved = reserved + q else sold = sold + q end
  local seq_s = int(seq)
  local order_no = order_prefix .. seq_s
  held_of[user] = held_of[user] + q
  accepted_at[rkey] = i
  ev_n = ev_n + 1
  ev_users[ev_n], ev_rids[ev_n], ev_qs[ev_n] = user, rid, qs
  first_seq = first_seq or seq_s
  return order_no, user .. ':' .. rid .. ':' .. qs .. ':' .. status_new .. ':'
    .. deadline_s .. ':' .. now_s
end

-- Pass 2: judge each request against the batch-local state.
for i = 1, n do
  local rkey = rkeys[i]
  local tag, a, b = 'X', 'INVALID_REQUEST', ''
  if rkey then
    local user, rid, qs = ARGV[3 * i - 1], ARGV[3 * i], ARGV[3 * i + 1]
    local j = accepted_at[rkey]
    local prior = prior_of[rkey]
    if j then
      tag, a, b = 'R', out[3 * j - 1], out[3 * j]
    elseif prior then
      tag, a, b = 'R', prior, redis.call('HGET', K_ORDERS, prior) or ''
    elseif window then
      a = window
    elseif qs == '1' or find(qs, '^[1-9]%d*$') then
      local q = tonumber(qs)
      if #qs > 12 or q > limit then
        a = 'LIMIT_EXCEEDED'
      elseif available < q then
        a = 'SOLD_OUT'
      elseif held(user) + q > limit then
        a = 'LIMIT_EXCEEDED'
      else
        tag = 'A'
        a, b = accept(i, user, rid, rkey, qs, q)
      end
    end
  end
  out[3 * i - 2], out[3 * i - 1], out[3 * i] = tag, a, b
end

--@stage judged
-- The deferred writes of the accepted requests, one command per key. A user accepted twice
-- is written twice with the same final units.
local w = 0
local requests, orders, holds, buyers = {}, {}, {}, {}
for i = 1, n do
  if out[3 * i - 2] == 'A' then
    local order_no, user = out[3 * i - 1], ARGV[3 * i - 1]
    requests[w + 1], requests[w + 2] = rkeys[i], order_no
    orders[w + 1], orders[w + 2] = order_no, out[3 * i]
    if mode == 'reserve' then holds[w + 1], holds[w + 2] = deadline_s, order_no end
    buyers[w + 1], buyers[w + 2] = user, int(held_of[user])
    w = w + 2
  end
end
if w > 0 then
  local concat = table.concat
  -- 'v': the entry's format version, so a reader that cannot read it waits on it.
  redis.call('XADD', K_EVENTS, '*', 'v', entry_v, 'sku_id', sku, 'epoch', epoch, 'kind', 'deducted',
    'first_seq', first_seq, 'n', int(ev_n), 'at_ms', now_s, 'deadline_ms', deadline_s,
    'users', concat(ev_users, ','), 'request_ids', concat(ev_rids, ','),
    'quantities', concat(ev_qs, ','))
  redis.call('HSET', K_REQUESTS, unpack(requests))
  redis.call('HSET', K_ORDERS, unpack(orders))
  if mode == 'reserve' then
    redis.call('ZADD', K_HOLDS, unpack(holds))
  end
  redis.call('HSET', K_BUYERS, unpack(buyers))
  redis.call('HSET', K_SALE, 'available', int(available), 'reserved', int(reserved),
    'sold', int(sold), 'seq', int(seq))
end
--@stage written
return out
