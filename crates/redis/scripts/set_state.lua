#!lua
-- Sets the operator state of an open sale; with a second argument, only when the state is
-- that one now (back-pressure's auto-pause must never reopen a sale an operator paused or
-- ended meanwhile).
-- KEYS: 1 sale. ARGV: 1 state, [2 expected current state]
-- Returns 'OK', 'SKIPPED' (the state was not the expected one) or 'FENCED' (a rebuild owns
-- the copy; it opens it in the database's state). Error replies: 'INVALID_ARGS', 'NOT_WARMED'.
if #KEYS ~= 1 or #ARGV < 1 or #ARGV > 2 then
  return redis.error_reply('INVALID_ARGS set_state needs 1 key and 1 or 2 args')
end
local states = { scheduled = true, live = true, paused = true, ended = true }
local state, from = ARGV[1], ARGV[2]
if not states[state] or (from and not states[from]) then
  return redis.error_reply('INVALID_ARGS state must be scheduled|live|paused|ended')
end
local f = redis.call('HMGET', KEYS[1], 'state', 'fenced_at_ms')
if not f[1] then
  return redis.error_reply('NOT_WARMED sale is not in the hot ledger')
end
if f[2] then return 'FENCED' end
if from and f[1] ~= from then return 'SKIPPED' end
redis.call('HSET', KEYS[1], 'state', state)
return 'OK'
