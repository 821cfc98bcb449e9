-- Judges a batch of purchases of one sale, in order; mirrors flashsale_core::SaleBook check for
-- check: replay -> state/window -> quantity -> stock -> per-user limit -> accept.
-- KEYS: 1 sale, 2 buyers, 3 requests, 4 orders, 5 holds, 6 events, 7 rec, 8 seqs (all tagged
--       {<sku>}); a copy of layout 1 uses 2-4, one of layout 2 (records.lua) 7 and 8.
-- ARGV: n, then n times: user_id, request_id, quantity
-- Returns what the caller cannot tell from its own requests: the copy's epoch, the status of
-- an order taken now, its deadline_ms and created_at_ms (shared by every order the call takes:
-- an order taken now is <sku>-<epoch>-<seq> of the request's user, request id and quantity),
-- then one value per request, in order:
--   seq                              accepted now
--   -seq                             a replay of the request accepted now at seq
--   {order_no, encoded_order}        a replay of a request accepted before (no change)
--   CODE                             rejected (no change)
-- Error replies: 'NOT_WARMED' (no sale hash), 'INVALID_ARGS' (malformed call, no change).
-- A fenced copy (a rebuild is replacing it) answers 'UNAVAILABLE' to every new request.
-- Encoded order: user:request_id:quantity:status:deadline_ms:created_at_ms
--
-- Cost per request is what bounds a spike, so every check of the whole batch runs against
-- batch-local copies, all reads come before the deferred writes, and each key is read and
-- written with one command per batch. Layout 2 reads each buyer's record once (its replays,
-- units and orders: one HMGET) and writes it once (one HSET), and writes one member for the
-- whole call to `seqs`; layout 1 reads the requests hash, then the buyers hash (only when
-- something reaches the limit check), and writes requests, orders and buyers.
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
-- a return there) to measure what each part costs Redis per purchase (of layout 2).
local K_SALE, K_BUYERS, K_REQUESTS, K_ORDERS, K_HOLDS, K_EVENTS, K_REC, K_SEQS =
  KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6], KEYS[7], KEYS[8]
if #KEYS ~= 8 then
  return redis.error_reply('INVALID_ARGS purchase needs 8 keys')
end

local find, format = string.find, string.format
-- ARGV read as a local: each read of a global is a search of the globals' table, and a request
-- reads its three arguments in several passes.
local ARGV = ARGV
local function int(x) return format('%d', x) end

local n = tonumber(ARGV[1])
if not (ARGV[1] and find(ARGV[1], '^[1-9]%d?%d?%d?$')) or n > 1024
    or #ARGV ~= 1 + 3 * n then
  return redis.error_reply('INVALID_ARGS purchase needs n in 1..1024 and 3n request fields')
end

local f = redis.call('HMGET', K_SALE, 'total', 'available', 'reserved', 'sold', 'seq',
  'epoch', 'limit', 'mode', 'timeout_ms', 'starts_at_ms', 'ends_at_ms', 'state', 'sku',
  'fenced_at_ms', 'buckets', 'layout', 'accepted', 'node')
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
local records, accepted = f[16] == '2', tonumber(f[17] or '0')
if not fenced and moved_with(K_SALE, f[18]) then fenced = '0' end
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

-- Pass 1: which requests are well formed: `valid[i]` is request i's key (user:request_id) on
-- layout 1, which looks requests up by it, and a true value on layout 2, which needs no key (its
-- two arguments checked apart cost Redis less than the key made). Fast path: a user id under
-- 10^19 and a plain request id pass one pattern (each).
local valid = {}
for i = 1, n do
  local user, rid = ARGV[3 * i - 1], ARGV[3 * i]
  local plain = #user < 20 and #rid <= 64
  if records then
    valid[i] = (plain and find(user, '^[1-9]%d*$') and find(rid, '^[%w_%-]+$'))
      or (is_user(user) and is_rid(rid))
  else
    local rkey = user .. ':' .. rid
    valid[i] = ((plain and find(rkey, '^[1-9]%d*:[%w_%-]+$')) or (is_user(user) and is_rid(rid)))
      and rkey
  end
end

-- The well-formed requests' users (`users`) or, on layout 1, request keys, in batch order, and
-- how many.
local function keyed(users)
  local list, m = {}, 0
  for i = 1, n do
    if valid[i] then
      m = m + 1
      list[m] = users and ARGV[3 * i - 1] or valid[i]
    end
  end
  return list, m
end

local status_new = (mode == 'reserve') and 'RESERVED' or 'CREATED'
local deadline = (mode == 'reserve') and now + timeout_ms or 0
local now_s, deadline_s = int(now), int(deadline)
local order_prefix = sku .. '-' .. epoch .. '-'
-- The reply: its head, then request i's answer at HEAD + i.
local HEAD = 4
local out = { epoch, status_new, deadline_s, now_s }
-- The stream entry's lists (one value per accepted request) and its first seq.
local ev_users, ev_rids, ev_qs, ev_n, first_seq = {}, {}, {}, 0, nil

-- The quantity a request asks for, or the code that refuses it before the buyer's units count:
-- the window, the quantity's form, the per-user limit, the stock.
local function judge(qs)
  if window then return nil, window end
  if not (qs == '1' or find(qs, '^[1-9]%d*$')) then return nil, 'INVALID_REQUEST' end
  -- '1' is most purchases, and tonumber (strtod) costs Redis some 1,500 instructions.
  local q = qs == '1' and 1 or tonumber(qs)
  if #qs > 12 or q > limit then return nil, 'LIMIT_EXCEEDED' end
  if available < q then return nil, 'SOLD_OUT' end
  return q
end

-- Answers every request in batch order into `out`: a replay (`prior_answer(user, rid, i)`: -seq
-- for a request accepted earlier in this call, the answer of an order taken before it, nil for
-- a new request), a refusal, or an acceptance: the units and the event taken here, the order
-- recorded by `accept(user, rid, qs, seq, units, i)` (units: what the buyer holds with it).
-- `held(user)`: the units a buyer holds, asked once per request that reaches the limit check.
-- The steps of an acceptance are written out in this loop, not in helpers of their own: each
-- Lua call costs Redis about a hundred instructions, and a purchase made several
-- (scripts/bench-script-instr.sh counts a purchase's instructions).
local function answer_all(held, prior_answer, accept)
  for i = 1, n do
    local answer = 'INVALID_REQUEST'
    if valid[i] then
      local user, rid, qs = ARGV[3 * i - 1], ARGV[3 * i], ARGV[3 * i + 1]
      local q
      answer = prior_answer(user, rid, i)
      if not answer then q, answer = judge(qs) end
      local units = q and held(user) + q
      if units and units > limit then
        answer = 'LIMIT_EXCEEDED'
      elseif units then
        seq = seq + 1
        available = available - q
        if mode == 'reserve' then reserved = reserved + q else sold = sold + q end
        ev_n = ev_n + 1
        ev_users[ev_n], ev_rids[ev_n], ev_qs[ev_n] = user, rid, qs
        first_seq = first_seq or seq
        accept(user, rid, qs, seq, units, i)
        answer = seq
      end
    end
    out[HEAD + i] = answer
  end
end

-- The writes every accepted batch makes, whatever the layout: the stream entry (its users
-- also name the buyers of layout 2's batch member), the holds and the counters.
local function write_common(users)
  local concat = table.concat
  local first = int(first_seq)
  -- 'v': the entry's format version, so a reader that cannot read it waits on it.
  redis.call('XADD', K_EVENTS, '*', 'v', entry_v, 'sku_id', sku, 'epoch', epoch, 'kind', 'deducted',
    'first_seq', first, 'n', int(ev_n), 'at_ms', now_s, 'deadline_ms', deadline_s,
    'users', users, 'request_ids', concat(ev_rids, ','), 'quantities', concat(ev_qs, ','))
  if mode == 'reserve' then
    local holds = {}
    for k = 1, ev_n do
      holds[2 * k - 1], holds[2 * k] = deadline_s, order_prefix .. int(first_seq + k - 1)
    end
    redis.call('ZADD', K_HOLDS, unpack(holds))
  end
  -- Layout 2 counts its accepted requests (for the sold-out flag's version); layout 1's count
  -- is the requests hash's length.
  local counted = records and { 'accepted', int(accepted + ev_n) } or {}
  redis.call('HSET', K_SALE, 'available', int(available), 'reserved', int(reserved),
    'sold', int(sold), 'seq', int(seq), unpack(counted))
end

-- The fields of hash `key` among the first `m` of `names` that exist, by name: one HMGET.
local function found_in(key, names, m)
  local by_name = {}
  if m > 0 then
    local got = redis.call('HMGET', key, unpack(names, 1, m))
    for j = 1, m do
      if got[j] then by_name[names[j]] = got[j] end
    end
  end
  return by_name
end

-- Layout 2: one record per buyer (records.lua).
local function purchase_records()
  -- One look-up of every buyer of the batch (a buyer twice is read twice: no dedup table).
  local users, m = keyed(true)
  local rec_of = found_in(K_REC, users, m)
--@stage records
  local letter = REC_LETTER[status_new]
  -- Per buyer of an order taken in this call: the units it holds with it (`held_of`) and the
  -- orders added to its record (`new_rec`, in the record's format). Any other buyer holds what
  -- its record says (nothing, for most of a spike), and asking it adds no table entry.
  local held_of, new_rec, changed, n_changed = {}, {}, {}, 0
  local function held(user)
    local h = held_of[user]
    if h then return h end
    local rec = rec_of[user]
    return rec and rec_held(rec) or 0
  end
  -- A request accepted earlier in this call is among the buyer's added orders; one accepted
  -- before it, in its record.
  local function prior_answer(user, rid)
    local added = new_rec[user]
    local o = added and rec_order_of(added, rid)
    if o then return -tonumber(o.seq) end
    local rec = rec_of[user]
    o = rec and rec_order_of(rec, rid)
    if not o then return nil end
    local _, at = rec_batch_of(K_SEQS, o.seq)
    return { sku .. '-' .. o.epoch .. '-' .. o.seq, rec_encode(user, o, at or '0', mode, timeout_ms) }
  end
  local function accept(user, rid, qs, seq, units)
    held_of[user] = units
    local entry = rid .. ',' .. epoch .. ',' .. int(seq) .. ',' .. qs .. ',' .. letter
    local added = new_rec[user]
    if not added then
      n_changed = n_changed + 1
      changed[n_changed] = user
    end
    new_rec[user] = added and (added .. ';' .. entry) or entry
  end
  answer_all(held, prior_answer, accept)
--@stage judged
  if ev_n == 0 then return end
  local recs = {}
  -- A new buyer's short record is what rec_extended would give back as it is: taken here
  -- without the call, which counted some 470 instructions a purchase (bench-script-instr.sh).
  for k = 1, n_changed do
    local user = changed[k]
    local rec, added = rec_of[user], new_rec[user]
    recs[2 * k - 1] = user
    recs[2 * k] = (rec or #added > REC_COUNTED_LEN) and rec_extended(rec, added, held_of[user])
      or added
  end
  redis.call('HSET', K_REC, unpack(recs))
  local users_s = table.concat(ev_users, ',')
  local first = int(first_seq)
  redis.call('ZADD', K_SEQS, first, first .. ':' .. now_s .. ':' .. users_s)
  write_common(users_s)
end

-- Layout 1: the requests, orders and buyers hashes (a copy loaded by an older release, or
-- while layout 2 is off).
local function purchase_hashes()
  local lookup, m = keyed(false)
  local prior_of = found_in(K_REQUESTS, lookup, m)
  -- Units held per user, read on first need for every user of the batch at once.
  local held_of = nil
  local function held(user)
    if held_of == nil then
      held_of = {}
      local users = keyed(true)
      local got = redis.call('HMGET', K_BUYERS, unpack(users))
      for j = 1, #users do
        held_of[users[j]] = got[j] and tonumber(got[j]) or 0
      end
    end
    return held_of[user]
  end
  local accepted_at = {}  -- request key -> seq of its acceptance in this call
  local function prior_answer(_, _, i)
    local rkey = valid[i]
    local j = accepted_at[rkey]
    if j then return -j end
    local prior = prior_of[rkey]
    return prior and { prior, redis.call('HGET', K_ORDERS, prior) or '' }
  end
  local function accept(user, _, _, seq, units, i)
    held_of[user] = units
    accepted_at[valid[i]] = seq
  end
  answer_all(held, prior_answer, accept)
  if ev_n == 0 then return end
  -- One command per key. A user accepted twice is written twice with the same final units.
  local w = 0
  local requests, orders, buyers = {}, {}, {}
  for i = 1, n do
    local a = out[HEAD + i]
    if type(a) == 'number' and a > 0 then
      local user, rid, qs = ARGV[3 * i - 1], ARGV[3 * i], ARGV[3 * i + 1]
      local order_no = order_prefix .. int(a)
      requests[w + 1], requests[w + 2] = valid[i], order_no
      orders[w + 1], orders[w + 2] = order_no, user .. ':' .. rid .. ':' .. qs .. ':'
        .. status_new .. ':' .. deadline_s .. ':' .. now_s
      buyers[w + 1], buyers[w + 2] = user, int(held_of[user])
      w = w + 2
    end
  end
  redis.call('HSET', K_REQUESTS, unpack(requests))
  redis.call('HSET', K_ORDERS, unpack(orders))
  redis.call('HSET', K_BUYERS, unpack(buyers))
  write_common(table.concat(ev_users, ','))
end

if records then purchase_records() else purchase_hashes() end
--@stage written
return out
