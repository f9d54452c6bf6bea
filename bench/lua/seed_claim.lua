--[[
  The seeds' claim, as written in seed 000: take up to `limit` due members
  and delete them in the same script. No lease: a consumer that dies after
  this call has lost them.

  KEYS[1] the sorted set
  ARGV[1] now (ms), ARGV[2] limit
  Returns the claimed members.
]]
local rcall = redis.call
local orders = rcall('ZRANGEBYSCORE', KEYS[1], 0, ARGV[1], 'LIMIT', 0, ARGV[2])
if #orders == 0 then
  return {}
end
rcall('ZREM', KEYS[1], unpack(orders))
return orders
