#!lua
-- Sets the operator state of a warm sale.
-- KEYS: 1 sale. ARGV: 1 state (scheduled | live | paused | ended)
-- Returns 'OK'. Error replies: 'INVALID_ARGS', 'NOT_WARMED'.
if #KEYS ~= 1 or #ARGV ~= 1 then
  return redis.error_reply('INVALID_ARGS set_state needs 1 key and 1 arg')
end
local state = ARGV[1]
if state ~= 'scheduled' and state ~= 'live' and state ~= 'paused' and state ~= 'ended' then
  return redis.error_reply('INVALID_ARGS state must be scheduled|live|paused|ended')
end
if redis.call('EXISTS', KEYS[1]) == 0 then
  return redis.error_reply('NOT_WARMED sale is not in the hot ledger')
end
redis.call('HSET', KEYS[1], 'state', state)
return 'OK'
