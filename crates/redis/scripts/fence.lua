#!lua
-- Fences a sale's hot copy: from now on purchase, resolve and expire_due change nothing
-- (purchases and resolutions answer UNAVAILABLE) until a newer copy is loaded and opened.
-- Idempotent: a fenced copy keeps the time it was first fenced. A copy loaded and not opened
-- yet stays fenced for good: its loader's open answers STALE.
-- KEYS: 1 sale. ARGV: none.
-- Returns 1 when the sale has a hot copy (now fenced), 0 when it has none.
if #KEYS ~= 1 or #ARGV ~= 0 then
  return redis.error_reply('INVALID_ARGS fence needs 1 key and no args')
end
if redis.call('EXISTS', KEYS[1]) == 0 then return 0 end
-- A copy its load left closed is fenced by someone else now: its loader must not open it
-- (open.lua), for this fence's rebuild may replace it after draining nothing.
redis.call('HDEL', KEYS[1], 'unopened')
if not redis.call('HGET', KEYS[1], 'fenced_at_ms') then
  local t = redis.call('TIME')
  local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  redis.call('HSET', KEYS[1], 'fenced_at_ms', string.format('%d', now))
end
return 1
