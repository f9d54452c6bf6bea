--[[
  Where members are: their pending score and their lease expiry, read at one instant.

  KEYS[1] pending  sorted set: member = order id, score = deadline (ms)
  KEYS[2] leased   sorted set: member = order id, score = lease expiry (ms)
  ARGV[1..]        members

  One script, so a member a consumer moves between the two sets meanwhile
  (a reschedule, a retry, a claim) is seen in one or the other, never in
  neither: two reads in a pipeline could report it missing, and the scan
  would take it for lost.
  Returns { pending scores..., lease expiries... } ("" where there is none).
]]
local rcall = redis.call
local pending = rcall('ZMSCORE', KEYS[1], unpack(ARGV))
local leased = rcall('ZMSCORE', KEYS[2], unpack(ARGV))
local reply = {}
for i = 1, #ARGV do reply[i] = pending[i] or '' end
for i = 1, #ARGV do reply[#ARGV + i] = leased[i] or '' end
return reply
