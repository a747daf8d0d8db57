-- Deletes the lock only if this release still holds it. Answers 1 if deleted.
-- Positions: scripts.rs, UnlockArgs.
local lock_key = KEYS[1]
local token = ARGV[1]

if redis.call("GET", lock_key) == token then
  return redis.call("DEL", lock_key)
end
return 0
