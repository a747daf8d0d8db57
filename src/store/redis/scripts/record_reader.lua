-- What both record-reading scripts (begin.lua, records.lua) share; it opens each of them.
-- `put` appends one item of the answer: LEN:BYTES, or "-" for nil (answer.rs reads them).
--
-- `read_records` answers the records of `keys` (their ids in `ids`) in order: their
-- number, then per record its id and its answer. A record's guard fields are read whole
-- only when they total at most `max_record` bytes and fit in `budget`; their sizes are
-- taken first (HSTRLEN), so a larger record is never copied. It stops before a record
-- once it has answered `batch_records` of them, or before copying a record that would
-- take what it copied past `batch_bytes` (the first record of a call is always read):
-- the ids after the last one answered are left for the next call (records.lua). So one
-- call copies at most max(batch_bytes, max_record) bytes of fields. It returns whether
-- ids were left.
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
local function read_records(ids, keys, fields, max_record, budget, batch_records, batch_bytes)
  local count_at = #out + 1
  out[count_at], out[count_at + 1] = "", ""
  local answered, copied = 0, 0
  for i, key in ipairs(keys) do
    if answered >= batch_records then break end
    local kind = redis.call("TYPE", key)["ok"]
    if kind == "none" then
      put(ids[i]) put("missing")
    elseif kind ~= "hash" then
      put(ids[i]) put("wrong_type") put(kind)
    else
      local size = 0
      for _, f in ipairs(fields) do size = size + redis.call("HSTRLEN", key, f) end
      if size > max_record then
        put(ids[i]) put("too_large") put(size)
      elseif size > budget then
        put(ids[i]) put("over_budget") put(size)
      elseif answered > 0 and copied + size > batch_bytes then
        break
      else
        put(ids[i]) put("ok") put(size)
        local values = redis.call("HMGET", key, unpack(fields))
        for j = 1, #fields do put(values[j]) end
        budget = budget - size
        copied = copied + size
      end
    end
    answered = answered + 1
  end
  local n = tostring(answered)
  out[count_at], out[count_at + 1] = #n .. ":", n
  return answered < #keys
end
