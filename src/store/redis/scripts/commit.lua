-- The fenced commit: only while the lock still holds this token, and only if nothing is
-- stored yet, stores the decided result and its audit record (or, if the cancel marker is
-- present now, the CANCELLED result and its audit record) with their TTL, and frees the
-- lock. Each audit record is a whole JSON text, written as it is.
-- Then, on a single node, it appends the stored result's entry to the decision stream
-- (KEYS[5], when given: XADD ... MAXLEN ~ ARGV[7] with the ARGV[8] field/value pairs of the
-- decided entry from ARGV[9], then those of the CANCELLED entry), so a stored result has its
-- entry exactly once and a result already stored gets none. The append is a pcall: its
-- failure is answered, never undoes the commit.
-- Answers {what, stored result or "", appended}: what = decided | cancelled | stored | lost;
-- for cancelled, the marker's value instead of the stored result (`http` when the cancel
-- route set it); appended = ok | - (no entry asked, or nothing stored) | the append's error.
-- Positions: scripts.rs, CommitArgs.
local lock_key, release_key, audit_key, cancelled_key = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local token, ttl = ARGV[1], ARGV[2]
local result, audit = ARGV[3], ARGV[4]
local cancelled_result, cancelled_audit = ARGV[5], ARGV[6]

local decisions_key = KEYS[5]
local max_len, pairs = ARGV[7], tonumber(ARGV[8] or "0")
local FIRST_PAIR = 9

local stored = redis.call("GET", release_key)
if redis.call("GET", lock_key) ~= token then
  return {"lost", stored or "", "-"}
end
if stored then
  redis.call("DEL", lock_key)
  return {"stored", stored, "-"}
end
local what, first = "decided", FIRST_PAIR
local marker = redis.call("GET", cancelled_key)
if marker then
  what, result, audit = "cancelled", cancelled_result, cancelled_audit
  first = FIRST_PAIR + 2 * pairs
  if marker == "http" then
    -- The cancel route set it: the record's last key says so (store::cancelled_by_http).
    audit = string.gsub(audit, '"cancelled_by":[^,{}]*}$', '"cancelled_by":"http"}')
  end
end
redis.call("SET", release_key, result, "EX", ttl)
redis.call("SET", audit_key, audit, "EX", ttl)
redis.call("DEL", lock_key)
local appended = "-"
if decisions_key and pairs > 0 then
  local xadd = {"XADD", decisions_key, "MAXLEN", "~", max_len, "*"}
  for i = first, first + 2 * pairs - 1 do xadd[#xadd + 1] = ARGV[i] end
  local added = redis.pcall(unpack(xadd))
  if type(added) == "table" and added.err then
    appended = added.err
  else
    appended = "ok"
  end
end
return {what, marker or "", appended}
