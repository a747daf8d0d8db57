-- The start of a release, in one step: a stored result is answered as it is; a lock held
-- by another token answers that token and how long its lease has left; otherwise the lock
-- is taken (or kept, for the same token) for one lease and, unless the cancel marker is
-- set, the run's evidence is read at once, so that a release needs no second round trip
-- before it decides.
--
-- The evidence: the calls list (its most recent max_calls ids, each at most max_id bytes;
-- longer ones are answered as "" and not looked up) and the guard's fields of the records
-- of the cited ids (the keys after the first four) and then of the listed calls, most
-- recent first (their keys are the run's record key prefix followed by the id, so every
-- key is in the run's slot). Ids that are not UTF-8, blank (Unicode white space only),
-- over-long or repeated are not looked up, as the harness's lookup_ids does for the cited
-- ones. A record whose fields total more than max_record bytes, or that would take the
-- release past its budget, is answered by its size only; other types by their type.
--
-- The answer is one string of items (see record_reader.lua): stored RESULT | locked TOKEN
-- MS | cancelled | taken, then the calls (ok N ids... | missing | wrong_type TYPE) and the
-- records as records.lua answers them.
-- Positions: scripts.rs, BeginArgs.
local release_key, lock_key, cancelled_key, calls_key = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local FIRST_CITED = 5
local token, lease_ms = ARGV[1], ARGV[2]
local max_calls, max_id = tonumber(ARGV[3]), tonumber(ARGV[4])
local max_record, budget = tonumber(ARGV[5]), tonumber(ARGV[6])
local prefix = ARGV[7]
local FIRST_FIELD = 8

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
local function utf8(s)
  local i, n = 1, #s
  while i <= n do
    local c, len = s:byte(i), 0
    if c < 0x80 then len = 1
    elseif c >= 0xC2 and c <= 0xDF then len = 2
    elseif c >= 0xE0 and c <= 0xEF then len = 3
    elseif c >= 0xF0 and c <= 0xF4 then len = 4
    else return false end
    if i + len - 1 > n then return false end
    for j = i + 1, i + len - 1 do
      local d = s:byte(j)
      if d < 0x80 or d > 0xBF then return false end
    end
    local d = s:byte(i + 1)
    if (c == 0xE0 and d < 0xA0) or (c == 0xED and d > 0x9F)
      or (c == 0xF0 and d < 0x90) or (c == 0xF4 and d > 0x8F) then return false end
    i = i + len
  end
  return true
end
local function blank(id)
  local rest = id:gsub("[\t-\r ]", "")
  rest = rest:gsub("\194[\133\160]", ""):gsub("\225\154\128", "")
  rest = rest:gsub("\226\128[\128-\138\168\169\175]", ""):gsub("\226\129\159", "")
  rest = rest:gsub("\227\128\128", "")
  return #rest == 0
end
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
  listed = redis.call("LRANGE", calls_key, -max_calls, -1)
  put("ok")
  put(#listed)
  for i, id in ipairs(listed) do
    if #id > max_id then listed[i] = "" end
    put(listed[i])
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
for i = #listed, 1, -1 do
  local id = listed[i]
  if id ~= "" and not seen[id] and utf8(id) and not blank(id) then
    seen[id] = true
    ids[#ids + 1] = id
    keys[#keys + 1] = prefix .. id
  end
end
put(#ids)
for i, key in ipairs(keys) do
  put(ids[i])
  budget = read_record(key, fields, max_record, budget)
end
return table.concat(out)
