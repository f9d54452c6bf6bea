--[[
  Lease members to a claim that did not get them from claim.lua: the compensation scan,
  whose failed acts are then counted and retried as a consumer's are.

  KEYS[1] pending  sorted set: member = order id, score = deadline (ms)
  KEYS[2] leased   sorted set: member = order id, score = lease expiry (ms)
  KEYS[3] owners   hash: member = order id, value = token of the claim holding its lease
  ARGV[1] token    the taking claim's token
  ARGV[2] now (ms)
  ARGV[3] until    (ms) the lease's expiry
  ARGV[4..]        members

  A member whose lease another claim holds and has not run out is left to that
  claim (a consumer has it in hand). Any other is taken: out of pending, leased
  to this token until ARGV[3], so the retry script counts its failure and gives
  it its next try, and a taker that dies leaves it to be taken over.

  Returns the members taken.
]]
--!include owners_as_table
local rcall = redis.call
local pending, leased, owners = KEYS[1], KEYS[2], KEYS[3]
local token = ARGV[1]
local now = tonumber(ARGV[2])
local lease_until = ARGV[3]

local taken = {}
if #ARGV >= 4 then owners_as_table(owners) end
for i = 4, #ARGV do
  local member = ARGV[i]
  local owner = rcall('HGET', owners, member)
  local lease = tonumber(rcall('ZSCORE', leased, member))
  if not (owner and owner ~= token and lease and lease > now) then
    rcall('ZREM', pending, member)
    rcall('ZADD', leased, lease_until, member)
    rcall('HSET', owners, member, token)
    taken[#taken + 1] = member
  end
end
return taken
