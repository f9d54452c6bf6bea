--[[
  Forget members whose orders are settled for good (closed, paid, deleted).

  KEYS[1] pending  KEYS[2] leased  KEYS[3] owners  KEYS[4] attempts
  KEYS[5] first_failure  KEYS[6] takeovers  KEYS[7] busy
  ARGV[1] token    the claim's token (an ack), or "" (unschedule: no claim involved)
  ARGV[2..] members

  Each member leaves the pending set: another consumer that found the row
  locked while this one closed it may have put it back, and that is moot now.
  Its lease and its retry state go only if the lease is held by `token`, or
  by no claim at all, or `token` is "": a stale consumer cannot strip the
  lease of the claim that took its member over.
  Returns the number of members whose lease and state were dropped.
]]
local rcall = redis.call
local pending, leased, owners = KEYS[1], KEYS[2], KEYS[3]
local attempts, first_failure, takeovers, busy = KEYS[4], KEYS[5], KEYS[6], KEYS[7]
local token = ARGV[1]
local dropped = 0
for i = 2, #ARGV do
  local member = ARGV[i]
  rcall('ZREM', pending, member)
  local owner = rcall('HGET', owners, member)
  if token == '' or not owner or owner == token then
    rcall('ZREM', leased, member)
    rcall('HDEL', owners, member)
    rcall('HDEL', attempts, member)
    rcall('HDEL', first_failure, member)
    rcall('HDEL', takeovers, member)
    rcall('ZREM', busy, member)
    dropped = dropped + 1
  end
end
return dropped
