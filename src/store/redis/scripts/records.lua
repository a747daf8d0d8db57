-- The guard's fields of the records of the given keys, in priority order (the ids a
-- repaired Draft cites that the begin script did not read, or those a begin left for a
-- next call), answered as read_records answers them (record_reader.lua).
-- Positions: scripts.rs, RecordsArgs.
local max_record, budget = tonumber(ARGV[1]), tonumber(ARGV[2])
local batch_records, batch_bytes = tonumber(ARGV[3]), tonumber(ARGV[4])
local prefix = ARGV[5]
local FIRST_FIELD = 6

local fields = {}
for i = FIRST_FIELD, #ARGV do fields[#fields + 1] = ARGV[i] end
local ids = {}
for i, key in ipairs(KEYS) do ids[i] = string.sub(key, #prefix + 1) end
read_records(ids, KEYS, fields, max_record, budget, batch_records, batch_bytes)
return table.concat(out)
