#!lua
-- Gives up the persister lease of a sale, only when the caller holds it.
-- KEYS: 1 lease. ARGV: 1 owner. Returns 1 when released, 0 otherwise.
if #KEYS ~= 1 or #ARGV ~= 1 then
  return redis.error_reply('INVALID_ARGS lease_release needs 1 key and 1 arg')
end
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('DEL', KEYS[1])
  return 1
end
return 0
