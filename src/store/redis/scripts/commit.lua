-- The fenced commit: only while the lock still holds this token, and only if nothing is
-- stored yet, stores the decided result and its audit record (or, if the cancel marker is
-- present now, the CANCELLED result and its audit record) with their TTL, and frees the
-- lock. The audit record is sent as its head (ARGV[4], the record's keys up to its end,
-- once) and the two ends (ARGV[5] decided, ARGV[7] cancelled); the stored record is the head
-- followed by the end of the result stored.
-- Then, on a single node, it appends the stored result's entry to the decision stream
-- (KEYS[5], when given: XADD ... MAXLEN ~ ARGV[8] with the ARGV[9] field/value pairs of the
-- decided entry from ARGV[10]; for the CANCELLED result, the pairs after them replace the
-- values of the fields they name), so a stored result has its entry exactly once and a
-- result already stored gets none. The append is a pcall: its
-- failure is answered, never undoes the commit.
-- Answers {what, stored result or "", appended}: what = decided | cancelled | stored | lost;
-- for cancelled, the marker's value instead of the stored result (`http` when the cancel
-- route set it); appended = ok | - (no entry asked, or nothing stored) | the append's error.
-- Positions: scripts.rs, CommitArgs.
local lock_key, release_key, audit_key, cancelled_key = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local token, ttl = ARGV[1], ARGV[2]
local result, audit_head, audit_end = ARGV[3], ARGV[4], ARGV[5]
local cancelled_result, cancelled_audit_end = ARGV[6], ARGV[7]

local decisions_key = KEYS[5]
local max_len, pairs = ARGV[8], tonumber(ARGV[9] or "0")
local FIRST_PAIR = 10

local stored = redis.call("GET", release_key)
if redis.call("GET", lock_key) ~= token then
  return {"lost", stored or "", "-"}
end
if stored then
  redis.call("DEL", lock_key)
  return {"stored", stored, "-"}
end
local what = "decided"
local marker = redis.call("GET", cancelled_key)
if marker then
  what, result, audit_end = "cancelled", cancelled_result, cancelled_audit_end
  if marker == "http" then
    -- The cancel route set it: the record's last key says so (store::cancelled_by_http).
    audit_end = string.gsub(audit_end, '"cancelled_by":[^,{}]*}$', '"cancelled_by":"http"}')
  end
end
redis.call("SET", release_key, result, "EX", ttl)
redis.call("SET", audit_key, audit_head .. audit_end, "EX", ttl)
redis.call("DEL", lock_key)
local appended = "-"
if decisions_key and pairs > 0 then
  local xadd = {"XADD", decisions_key, "MAXLEN", "~", max_len, "*"}
  local FIRST_NAME = #xadd + 1
  for i = FIRST_PAIR, FIRST_PAIR + 2 * pairs - 1 do xadd[#xadd + 1] = ARGV[i] end
  if marker then
    for i = FIRST_PAIR + 2 * pairs, #ARGV - 1, 2 do
      for name = FIRST_NAME, #xadd - 1, 2 do
        if xadd[name] == ARGV[i] then xadd[name + 1] = ARGV[i + 1] end
      end
    end
  end
  local added = redis.pcall(unpack(xadd))
  if type(added) == "table" and added.err then
    appended = added.err
  else
    appended = "ok"
  end
end
return {what, marker or "", appended}
