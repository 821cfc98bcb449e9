-- Prelude of the scripts that read or write buyer records (scripts.rs puts it after node.lua).
-- A copy loaded with layout 2 (its hash's `layout` field; load.lua) keeps one record per buyer
-- instead of the `requests`, `orders` and `buyers` hashes: field <user> of the `rec` hash holds
-- the buyer's orders, so a purchase reads a buyer once and writes it once. The replays are the
-- orders' request ids, the units held the sum of the live orders' quantities. One order:
--   request_id,epoch,seq,quantity,S[,deadline_ms]      orders joined by ';'
-- S is one letter of its status (REC_LETTER). The order number is <sku>-<epoch>-<seq>. What a
-- purchase call shares is not repeated per order: the batch (`seqs` zset, one member per call,
-- scored by its first seq: `<first_seq>:<at_ms>:<user>,<user>,...` in seq order) names the buyer
-- of each seq and the creation time of its order; the deadline of a hold is its creation time
-- plus the sale's timeout, stored with the order only when it is not (an order restored from
-- the database). A restored order is a batch of one.
-- A record longer than REC_COUNTED_LEN bytes ends with the units its live orders hold, a mark
-- `#<units>` after its last order: a purchase asks for its buyer's units, and a scan of the
-- orders grows with each order the buyer took (a buyer of a sale with a high per-user limit
-- may take hundreds), where reading the mark does not. A purchase appends its orders and the
-- mark after them, so a record is extended, never cut: Redis's Lua hashes every byte of every
-- string it makes, and a purchase makes two of the record (the one read, the one written). An
-- earlier mark stays where it was, read by no one; a rewrite of the orders (pay, cancel, expiry,
-- restore) leaves one, at the end. A shorter record has no mark: scanning a few orders costs
-- Redis less than reading and writing a number.
local REC_LETTER = { CREATED = 'C', RESERVED = 'R', PAID = 'P', CANCELLED = 'X', EXPIRED = 'E',
  PENDING = 'N', REJECTED = 'J' }
-- The letters of the statuses whose units count against the per-user limit (a pattern's class).
local REC_LIVE = '[CRPN]'

-- The pattern of one order, its fields captured (rec_orders), from where it starts.
local REC_ORDER = '([%w_%-]+),(%d+),(%d+),(%d+),(%u),?(%-?%d*)'
-- A record longer than this ends with the mark of its live units.
local REC_COUNTED_LEN = 128
-- The longest mark: `#` and a u64's digits.
local REC_MARK_LEN_MAX = 21

-- The live units a record's mark gives; nil when it has none.
local function rec_mark(rec)
  if #rec <= REC_COUNTED_LEN then return nil end
  local units = string.match(string.sub(rec, -REC_MARK_LEN_MAX), '#(%d+)$')
  return units and tonumber(units)
end

-- Record `rec` (nil: none yet) with the orders `added` (joined by `;`) after its own, marked
-- with `units`, its live units with them, when long: one string made, not one per piece.
local function rec_extended(rec, added, units)
  local len = (rec and #rec + 1 or 0) + #added
  if len <= REC_COUNTED_LEN then return rec and (rec .. ';' .. added) or added end
  local mark = '#' .. string.format('%d', units)
  if rec then return rec .. ';' .. added .. mark end
  return added .. mark
end

-- One order from the captures of REC_ORDER.
local function rec_fields(rid, e, s, q, st, dl)
  return { rid = rid, epoch = e, seq = s, q = q, st = st, dl = dl }
end

-- The orders of a record, in the order they were taken.
local function rec_orders(rec)
  local out = {}
  if not rec then return out end
  for rid, e, s, q, st, dl in string.gmatch(rec, REC_ORDER) do
    out[#out + 1] = rec_fields(rid, e, s, q, st, dl)
  end
  return out
end

-- One order of a record, as stored.
local function rec_order(o)
  local s = o.rid .. ',' .. o.epoch .. ',' .. o.seq .. ',' .. o.q .. ',' .. o.st
  if o.dl ~= '' then s = s .. ',' .. o.dl end
  return s
end

-- The record of `orders`, marked with their live units when long.
local function rec_join(orders)
  local parts, held = {}, 0
  for i, o in ipairs(orders) do
    parts[i] = rec_order(o)
    if string.find(o.st, REC_LIVE) then held = held + tonumber(o.q) end
  end
  return rec_extended(nil, table.concat(parts, ';'), held)
end

-- Units held in live orders: a purchase asks this of every buyer it judges. A long record's
-- mark; a short one read as it is, no table built per order. `,<digits>,<letter>` occurs in a
-- record only where an order's quantity meets its status: a request id comes after `;` or at
-- the record's start, never after `,`, and what follows the epoch and the seq is a number, not
-- a letter. The matcher passes over the orders that are not live without a step of Lua.
local function rec_held(rec)
  local units = rec_mark(rec)
  if units then return units end
  local held = 0
  for q in string.gmatch(rec, ',(%d+),' .. REC_LIVE) do held = held + tonumber(q) end
  return held
end

-- The order of a record taken for request id `rid`, or nil: a plain search for the id where
-- an order starts (at the record's start or after `;`, followed by `,`), so a record of many
-- orders is not parsed to answer one that is new.
local function rec_order_of(rec, rid)
  local key = rid .. ','
  local at = (string.sub(rec, 1, #key) == key) and 1
  if not at then
    local sep = string.find(rec, ';' .. key, 1, true)
    at = sep and sep + 1
  end
  if not at then return nil end
  local r, e, s, q, st, dl = string.match(rec, '^' .. REC_ORDER, at)
  return r and rec_fields(r, e, s, q, st, dl)
end

local function rec_find(orders, epoch, seq)
  for _, o in ipairs(orders) do
    if o.epoch == epoch and o.seq == seq then return o end
  end
  return nil
end

-- The buyer of seq `seq` and its order's creation time (ms), from the batch that took it;
-- nil when no batch of this copy took it.
local function rec_batch_of(k_seqs, seq)
  local m = redis.call('ZREVRANGEBYSCORE', k_seqs, seq, '-inf', 'LIMIT', '0', '1')[1]
  if not m then return nil end
  local first, at, users = string.match(m, '^(%d+):(%-?%d+):(.*)$')
  if not first then return nil end
  local skip = tonumber(seq) - tonumber(first)
  for u in string.gmatch(users, '[^,]+') do
    if skip == 0 then return u, at end
    skip = skip - 1
  end
  return nil
end

-- The status of letter `st`: REC_LETTER read backwards, when an order is read back (a table
-- of it would be built by every call of these scripts, most of which read none).
local function rec_status(st)
  for status, letter in pairs(REC_LETTER) do
    if letter == st then return status end
  end
  return nil
end

-- An order as the `orders` hash of layout 1 encodes it (what the service decodes):
-- user:request_id:quantity:status:deadline_ms:created_at_ms. `mode`, `timeout_ms`: the sale's.
local function rec_encode(user, o, created, mode, timeout_ms)
  local dl = o.dl
  if dl == '' then
    dl = (mode == 'reserve') and string.format('%d', tonumber(created) + timeout_ms) or '0'
  end
  return user .. ':' .. o.rid .. ':' .. o.q .. ':' .. rec_status(o.st) .. ':' .. dl .. ':'
    .. created
end
