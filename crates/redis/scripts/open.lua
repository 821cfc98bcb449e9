-- Opens a loaded (fenced) copy: sets its operator state and lifts the fence, only when it is
-- still the copy of the given epoch (a newer rebuild may have replaced it meanwhile) on the
-- node that loaded it (a failover midway may have left a copy missing restored orders), and
-- only when no fence came after its load (another rebuild is replacing it).
-- KEYS: 1 sale. ARGV: 1 epoch, 2 state (scheduled | live | paused | ended)
-- Returns 'OK' or 'STALE' (no copy, or a copy of another epoch). Error reply 'INVALID_ARGS'.
if #KEYS ~= 1 or #ARGV ~= 2 then
  return redis.error_reply('INVALID_ARGS open needs 1 key and 2 args')
end
local state = ARGV[2]
if state ~= 'scheduled' and state ~= 'live' and state ~= 'paused' and state ~= 'ended' then
  return redis.error_reply('INVALID_ARGS state must be scheduled|live|paused|ended')
end
if not string.match(ARGV[1], '^[1-9]%d*$') then
  return redis.error_reply('INVALID_ARGS epoch must be a positive integer')
end
if redis.call('HGET', KEYS[1], 'epoch') ~= ARGV[1] then return 'STALE' end
-- Fenced by another rebuild since its load (fence.lua): that rebuild read this epoch before
-- its fence and will replace the copy; opened now, it would sell what nobody drains.
if redis.call('HGET', KEYS[1], 'unopened') ~= '1' then return 'STALE' end
if moved(KEYS[1]) then return 'STALE' end
redis.call('HSET', KEYS[1], 'state', state)
redis.call('HDEL', KEYS[1], 'fenced_at_ms', 'unopened')
return 'OK'
