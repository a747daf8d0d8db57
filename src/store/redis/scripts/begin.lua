-- The start of a release, in one step: a stored result is answered as it is; a lock held
-- by another token answers that token and how long its lease has left; otherwise the lock
-- is taken (or kept, for the same token) for one lease and, unless the cancel marker is
-- set, the run's evidence is read at once, so that most releases need no second round trip
-- before they decide.
--
-- Its work is bounded by its arguments, whatever the agent wrote:
-- - the calls list is read only if Redis holds it in at most max_list_bytes (MEMORY USAGE
--   walks the list's nodes, not its elements); then its most recent max_calls ids, each at
--   most max_id bytes (a longer one is answered as "" and never looked up);
-- - the records to read are the cited ones (the keys after the first four; the harness
--   sends distinct, non-blank ids of at most max_id bytes, and at most
--   evidence.max_cited_calls of them), then those of the listed calls, most recent first,
--   skipping repeated and blank ones; the first listed id that is not ASCII ends this
--   call's list: the harness checks such ids (UTF-8, Unicode white space) and reads their
--   records with records.lua, as it reads whatever read_records leaves for a next call.
--
-- The answer is one string of items (see record_reader.lua): stored RESULT | locked TOKEN
-- MS | cancelled | taken, then the calls (ok | missing | wrong_type TYPE | too_large SIZE)
-- and the records as read_records answers them, then `more` if ids are left to look up
-- (the harness reads them), else `done`; after `taken`, it is the first element of
-- a pair whose second is the calls list as read (over-long ids as ""), which Redis answers
-- straight from the Lua table (cheaper than writing long ids as items).
-- Positions: scripts.rs, BeginArgs.
local release_key, lock_key, cancelled_key, calls_key = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local FIRST_CITED = 5
local token, lease_ms = ARGV[1], ARGV[2]
local max_calls, max_id = tonumber(ARGV[3]), tonumber(ARGV[4])
local max_list_bytes = tonumber(ARGV[5])
local max_record, budget = tonumber(ARGV[6]), tonumber(ARGV[7])
local batch_records, batch_bytes = tonumber(ARGV[8]), tonumber(ARGV[9])
local prefix = ARGV[10]
local FIRST_FIELD = 11

local stored = redis.call("GET", release_key)
if stored then
  put("stored")
  put(stored)
  return table.concat(out)
end
local holder = redis.call("GET", lock_key)
if holder and holder ~= token then
  put("locked")
  put(holder)
  put(math.max(0, redis.call("PTTL", lock_key)))
  return table.concat(out)
end
redis.call("SET", lock_key, token, "PX", lease_ms)
if redis.call("EXISTS", cancelled_key) == 1 then
  put("cancelled")
  return table.concat(out)
end
put("taken")
local fields = {}
for i = FIRST_FIELD, #ARGV do fields[#fields + 1] = ARGV[i] end
local listed = {}
local t = redis.call("TYPE", calls_key)["ok"]
if t == "none" then
  put("missing")
elseif t ~= "list" then
  put("wrong_type")
  put(t)
else
  local size = redis.call("MEMORY", "USAGE", calls_key, "SAMPLES", "0")
  if size > max_list_bytes then
    put("too_large")
    put(size)
  else
    listed = redis.call("LRANGE", calls_key, -max_calls, -1)
    put("ok")
    for i, id in ipairs(listed) do
      if #id > max_id then listed[i] = "" end
    end
  end
end
local ids, keys, seen = {}, {}, {}
for i = FIRST_CITED, #KEYS do
  local id = string.sub(KEYS[i], #prefix + 1)
  if not seen[id] then
    seen[id] = true
    ids[#ids + 1] = id
    keys[#keys + 1] = KEYS[i]
  end
end
-- Only as many listed ids as this call may read records of.
local wanted, cut = #ids + batch_records, false
for i = #listed, 1, -1 do
  if #ids >= wanted then cut = true break end
  local id = listed[i]
  if id ~= "" and not seen[id] then
    if id:find("[\128-\255]") then cut = true break end
    seen[id] = true
    if not id:find("^[\t-\r ]*$") then
      ids[#ids + 1] = id
      keys[#keys + 1] = prefix .. id
    end
  end
end
local left = read_records(ids, keys, fields, max_record, budget, batch_records, batch_bytes)
if left or cut then put("more") else put("done") end
return {table.concat(out), listed}
