#!lua
-- A sale's admission state (queue and draw), every change atomic in the sale's slot. The
-- clock is the server's (TIME): which joins form the pre-queue and whether an entry is in
-- its window never depend on an instance's clock.
-- KEYS: 1 adm (hash: seed, sealed, prequeue, after, admitted, bought, entries, draw_pos),
--       2 joins (hash: user -> 'p:<n>' | 'a:<n>'), 3 pre (list: pre-queue users),
--       4 waves (zset: to_place scored by at_ms), 5 wave_at (zset: '<to>:<at_ms>' scored by to),
--       6 bought (zset: user scored by place), 7 entries (hash: user -> quantity),
--       8 entry_list (list: users in entry order)
-- ARGV: 1 op, then the op's arguments (below). Error reply: 'INVALID_ARGS'.
if #KEYS ~= 8 or #ARGV < 1 then
  return redis.error_reply('INVALID_ARGS admission needs 8 keys and an op')
end
local op = ARGV[1]
local function int(i)
  local v = tonumber(ARGV[i])
  if not v or v < 0 or v ~= math.floor(v) then
    error({ err = 'INVALID_ARGS argument ' .. i .. ' must be a non-negative integer' })
  end
  return v
end
local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
local function field(name)
  return tonumber(redis.call('HGET', KEYS[1], name) or '0')
end

-- commit_seed <hex>: the first seed stays; answers the committed one.
if op == 'commit_seed' then
  if not ARGV[2] or #ARGV[2] ~= 64 then
    return redis.error_reply('INVALID_ARGS seed must be 64 hex digits')
  end
  redis.call('HSETNX', KEYS[1], 'seed', ARGV[2])
  return redis.call('HGET', KEYS[1], 'seed')
end

if not redis.call('HGET', KEYS[1], 'seed') then
  return redis.error_reply('NO_SEED no admission seed committed')
end

-- Calls `cmd key` with the list's items from `from` on as its further arguments, at most
-- `step` at a time (Lua's stack bounds one call's arguments). Answers the calls' answers.
local function each_slice(cmd, key, list, from, step)
  local answers = {}
  for i = from, #list, step do
    answers[#answers + 1] = redis.call(cmd, key, unpack(list, i, math.min(i + step - 1, #list)))
  end
  return answers
end

-- join_many <starts_at_ms> <len_max> <user>...: each user's answer, in order: its first
-- join's ticket ('p:<n>' | 'a:<n>'), also for a user twice in the list, a new one, or 'FULL'.
-- One clock reading, one read of the tickets and one write per key for the group.
if op == 'join_many' then
  local starts, len_max, now = int(2), int(3), now_ms()
  local had = {}
  for i = 4, #ARGV do int(i) end
  local k = 4
  for _, got in ipairs(each_slice('HMGET', KEYS[2], ARGV, 4, 1000)) do
    for _, t in ipairs(got) do
      had[ARGV[k]] = had[ARGV[k]] or t
      k = k + 1
    end
  end
  local prequeue, after = field('prequeue'), field('after')
  local pre = field('sealed') ~= 1 and now < starts
  local out, fresh, pushed = {}, {}, {}
  for i = 4, #ARGV do
    local user, t = ARGV[i], had[ARGV[i]]
    if not t and prequeue + after >= len_max then
      t = 'FULL'
    elseif not t then
      if pre then
        prequeue = prequeue + 1
        t = 'p:' .. prequeue
        pushed[#pushed + 1] = user
      else
        after = after + 1
        t = 'a:' .. after
      end
      had[user] = t
      fresh[#fresh + 1] = user
      fresh[#fresh + 1] = t
    end
    out[#out + 1] = t
  end
  if #fresh > 0 then
    each_slice('HSET', KEYS[2], fresh, 1, 2000)
    each_slice('RPUSH', KEYS[3], pushed, 1, 1000)
    redis.call('HSET', KEYS[1], 'prequeue', prequeue, 'after', after)
  end
  return out
end

-- seal <starts_at_ms>: closes the pre-queue once the clock reached the start; answers its
-- length, or -1 before the start.
if op == 'seal' then
  if now_ms() < int(2) then return -1 end
  redis.call('HSET', KEYS[1], 'sealed', 1)
  return field('prequeue')
end

-- counts <lapse_before_ms>: sealed, prequeue, after, admitted, bought, lapsed_through,
-- bought_through.
if op == 'counts' then
  local before = int(2)
  local last = redis.call('ZREVRANGEBYSCORE', KEYS[4], '(' .. before, '-inf', 'LIMIT', 0, 1)
  local through = tonumber(last[1] or '0')
  local bought_through = redis.call('ZCOUNT', KEYS[6], 1, through)
  return { field('sealed'), field('prequeue'), field('after'), field('admitted'),
    field('bought'), through, bought_through }
end

-- advance <from> <to>: moves the admission cursor (compare and set); records the wave.
if op == 'advance' then
  local from, to = int(2), int(3)
  if to <= from or field('admitted') ~= from then return 0 end
  local now = now_ms()
  redis.call('HSET', KEYS[1], 'admitted', to)
  redis.call('ZADD', KEYS[4], now, to)
  redis.call('ZADD', KEYS[5], to, to .. ':' .. now)
  return 1
end

-- admitted_at <place>: the time of the wave that admitted it (-1: none yet), and now.
if op == 'admitted_at' then
  local w = redis.call('ZRANGEBYSCORE', KEYS[5], int(2), '+inf', 'LIMIT', 0, 1)
  local at = -1
  if w[1] then at = tonumber(string.match(w[1], ':(%d+)$')) end
  return { at, now_ms() }
end

-- mark_bought <user> <place>: once per user.
if op == 'mark_bought' then
  local user, place = int(2), int(3)
  if redis.call('ZADD', KEYS[6], 'NX', place, ARGV[2]) == 1 then
    redis.call('HINCRBY', KEYS[1], 'bought', 1)
  end
  return 1
end

-- enter <user> <quantity> <opens_at_ms> <closes_at_ms> <len_max>: answers {'N', n},
-- {'A', quantity} (the user's entry before), 'NOT_OPEN', 'CLOSED' or 'FULL'.
if op == 'enter' then
  local user, qty, opens, closes, len_max = int(2), int(3), int(4), int(5), int(6)
  if qty < 1 then return redis.error_reply('INVALID_ARGS quantity must be positive') end
  local had = redis.call('HGET', KEYS[7], ARGV[2])
  if had then return { 'A', tonumber(had) } end
  local now = now_ms()
  if now < opens then return 'NOT_OPEN' end
  if now >= closes then return 'CLOSED' end
  if field('entries') >= len_max then return 'FULL' end
  local n = redis.call('HINCRBY', KEYS[1], 'entries', 1)
  redis.call('HSET', KEYS[7], ARGV[2], qty)
  redis.call('RPUSH', KEYS[8], ARGV[2])
  return { 'N', n }
end

-- advance_draw <from> <to>: moves the draw's position down the waitlist (compare and set).
if op == 'advance_draw' then
  local from, to = int(2), int(3)
  if field('draw_pos') ~= from then return 0 end
  redis.call('HSET', KEYS[1], 'draw_pos', to)
  return 1
end

return redis.error_reply('INVALID_ARGS unknown op ' .. op)
