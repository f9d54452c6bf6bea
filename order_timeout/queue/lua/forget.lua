--[[
  Forget members whose orders are settled for good (closed, paid, deleted).

  KEYS[1] pending  KEYS[2] leased  KEYS[3] owners  KEYS[4] attempts
  KEYS[5] first_failure  KEYS[6] takeovers  KEYS[7] busy  KEYS[8] held
  ARGV[1] token    the claim's token (an ack), or "" (unschedule: no claim involved)
  ARGV[2..] members (at most queue.SLICE: the caller slices)

  Each member leaves the pending set: another consumer that found the row
  locked while this one closed it may have put it back, and that is moot now.
  Its lease and its retry state go only if the lease is held by `token`, or
  by no claim at all, or `token` is "": a stale consumer cannot strip the
  lease of the claim that took its member over.
  A handful of variadic commands whatever the number of members.
  Returns the number of members whose lease and state were dropped.
]]
local rcall = redis.call
local pending, leased, owners = KEYS[1], KEYS[2], KEYS[3]
local attempts, first_failure, takeovers, busy, held = KEYS[4], KEYS[5], KEYS[6], KEYS[7], KEYS[8]
local token = ARGV[1]
local members = {}
for i = 2, #ARGV do members[#members + 1] = ARGV[i] end
if #members == 0 then return 0 end

rcall('ZREM', pending, unpack(members))

local ours = members
if token ~= '' then
  ours = {}
  local held_by = rcall('HMGET', owners, unpack(members))
  for i, member in ipairs(members) do
    if not held_by[i] or held_by[i] == token then ours[#ours + 1] = member end
  end
  if #ours == 0 then return 0 end
end

rcall('ZREM', leased, unpack(ours))
rcall('HDEL', owners, unpack(ours))
rcall('HDEL', attempts, unpack(ours))
rcall('HDEL', first_failure, unpack(ours))
rcall('HDEL', takeovers, unpack(ours))
rcall('ZREM', busy, unpack(ours))
rcall('ZREM', held, unpack(ours))
return #ours
