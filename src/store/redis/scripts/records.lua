-- The guard's fields of the records of the given keys (in priority order: the ids a
-- repaired Draft cites that the begin script did not read), bounded and answered as
-- begin.lua reads records: their number, then per record its id and its answer.
-- Positions: scripts.rs, RecordsArgs.
local FIRST_FIELD = 4
local max_record, budget, prefix = tonumber(ARGV[1]), tonumber(ARGV[2]), ARGV[3]

local fields = {}
for i = FIRST_FIELD, #ARGV do fields[#fields + 1] = ARGV[i] end
put(#KEYS)
for _, key in ipairs(KEYS) do
  put(string.sub(key, #prefix + 1))
  budget = read_record(key, fields, max_record, budget)
end
return table.concat(out)
