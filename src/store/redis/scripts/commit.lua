-- The fenced commit: only while the lock still holds this token, and only if nothing is
-- stored yet, stores the decided result and its audit record (or, if the cancel marker is
-- present now, the CANCELLED result and its audit record) with their TTL, and frees the
-- lock. Each audit record is a whole JSON text, written as it is.
-- Answers {what, stored result or ""}: what = decided | cancelled | stored | lost.
-- Positions: scripts.rs, CommitArgs.
local lock_key, release_key, audit_key, cancelled_key = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local token, ttl = ARGV[1], ARGV[2]
local result, audit = ARGV[3], ARGV[4]
local cancelled_result, cancelled_audit = ARGV[5], ARGV[6]

local stored = redis.call("GET", release_key)
if redis.call("GET", lock_key) ~= token then
  return {"lost", stored or ""}
end
if stored then
  redis.call("DEL", lock_key)
  return {"stored", stored}
end
local what = "decided"
if redis.call("EXISTS", cancelled_key) == 1 then
  what, result, audit = "cancelled", cancelled_result, cancelled_audit
end
redis.call("SET", release_key, result, "EX", ttl)
redis.call("SET", audit_key, audit, "EX", ttl)
redis.call("DEL", lock_key)
return {what, ""}
