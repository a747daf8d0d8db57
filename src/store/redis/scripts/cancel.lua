-- The cancel route's step: a stored result is answered as it is (it never changes, so
-- nothing is marked); otherwise the cancel marker is set. Atomic, like the commit's check
-- of the marker, so a cancel and a commit of the same run are ordered one way or the other.
-- Answers the stored result, or nil when the marker was set.
-- Positions: scripts.rs, CancelArgs.
local release_key, cancelled_key = KEYS[1], KEYS[2]
local marker, ttl = ARGV[1], ARGV[2]

local stored = redis.call("GET", release_key)
if stored then
  return stored
end
redis.call("SET", cancelled_key, marker, "EX", ttl)
return false
