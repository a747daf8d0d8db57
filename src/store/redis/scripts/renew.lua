-- Renews a lease only while the lock still holds this token. Answers 1 if renewed.
-- Positions: scripts.rs, RenewArgs.
local lock_key = KEYS[1]
local token, lease_ms = ARGV[1], ARGV[2]

if redis.call("GET", lock_key) == token then
  return redis.call("PEXPIRE", lock_key, lease_ms)
end
return 0
