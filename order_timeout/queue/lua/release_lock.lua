--[[
  Release a lock only if we still hold it.

  KEYS[1] lock   string holding the holder's token
  ARGV[1] token  our token

  Returns 1 if released, 0 if the lock had expired or another holder has it.
]]
local rcall = redis.call
if rcall('GET', KEYS[1]) == ARGV[1] then
  return rcall('DEL', KEYS[1])
end
return 0
