--[[
  Extend a lock only if we still hold it.

  KEYS[1] lock   string holding the holder's token
  ARGV[1] token  our token
  ARGV[2] ttl    new time to live (ms)

  Returns 1 if renewed, 0 if the lock is no longer ours.
]]
local rcall = redis.call
if rcall('GET', KEYS[1]) == ARGV[1] then
  return rcall('PEXPIRE', KEYS[1], ARGV[2])
end
return 0
