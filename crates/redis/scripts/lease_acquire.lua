#!lua
-- Takes the persister lease of a sale, or renews it when the caller already holds it.
-- KEYS: 1 lease. ARGV: 1 owner, 2 ttl_ms (1..9999999)
-- Returns 1 when the caller holds the lease afterwards, 0 when someone else does.
if #KEYS ~= 1 or #ARGV ~= 2 then
  return redis.error_reply('INVALID_ARGS lease_acquire needs 1 key and 2 args')
end
local owner, ttl = ARGV[1], ARGV[2]
if #owner < 1 or #owner > 200 or not string.match(ttl, '^[1-9]%d*$') or #ttl > 7 then
  return redis.error_reply('INVALID_ARGS owner must be 1..200 bytes, ttl_ms 1..9999999')
end
local current = redis.call('GET', KEYS[1])
if not current then
  redis.call('SET', KEYS[1], owner, 'PX', ttl)
  return 1
end
if current == owner then
  redis.call('PEXPIRE', KEYS[1], ttl)
  return 1
end
return 0
