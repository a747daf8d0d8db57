-- What both record-reading scripts (begin.lua, records.lua) share; it opens each of them.
-- `put` appends one item of the answer: LEN:BYTES, or "-" for nil (answer.rs reads them).
-- `read_record` appends one record's answer: its guard fields are read whole only when
-- they total at most `max_record` bytes and fit in `budget`; it answers the budget left.
-- A record answer is: ok SIZE fields... | missing | wrong_type TYPE | too_large SIZE |
-- over_budget SIZE.
local out = {}
local function put(s)
  if s then
    s = tostring(s)
    out[#out + 1] = #s .. ":"
    out[#out + 1] = s
  else
    out[#out + 1] = "-"
  end
end
local function read_record(key, fields, max_record, budget)
  local kind = redis.call("TYPE", key)["ok"]
  if kind == "none" then put("missing") return budget end
  if kind ~= "hash" then put("wrong_type") put(kind) return budget end
  local size = 0
  for _, f in ipairs(fields) do size = size + redis.call("HSTRLEN", key, f) end
  if size > max_record then put("too_large") put(size) return budget end
  if size > budget then put("over_budget") put(size) return budget end
  put("ok")
  put(size)
  local values = redis.call("HMGET", key, unpack(fields))
  for j = 1, #fields do put(values[j]) end
  return budget - size
end
