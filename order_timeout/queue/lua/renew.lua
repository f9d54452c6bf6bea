--[[
  Move the lease expiry of members this claim still holds.

  KEYS[1] leased  sorted set: member = order id, score = lease expiry (ms)
  KEYS[2] owners  hash: member = order id, value = token of the claim holding its lease
  ARGV[1] token   the claim's token
  ARGV[2] until   (ms) the new expiry: later to keep a batch in progress, or
                  in the past to hand a batch we gave up to the next claim at once
  ARGV[3..]       members

  Returns the number of leases moved.
]]
local rcall = redis.call
local leased, owners = KEYS[1], KEYS[2]
local token, lease_until = ARGV[1], ARGV[2]
local moved = 0
for i = 3, #ARGV do
  local member = ARGV[i]
  if rcall('HGET', owners, member) == token then
    moved = moved + rcall('ZADD', leased, 'XX', 'CH', lease_until, member)
  end
end
return moved
