--[[
  Forget members whose orders are settled for good (closed, paid, deleted).

  KEYS[1] pending  KEYS[2] leased  KEYS[3] owners  KEYS[4] attempts
  KEYS[5] first_failure  KEYS[6] takeovers  KEYS[7] busy  KEYS[8] held
  ARGV[1] token    the claim's token (an ack), or "" (unschedule: no claim involved)
  ARGV[2..] members (at most queue.SLICE: the caller slices)

  What goes, and whose lease, is lib/forget_members.lua's (claim.lua acks with it too).
  Returns the number of members whose lease and state were dropped.
]]
--!include forget_members
local members = {}
for i = 2, #ARGV do members[#members + 1] = ARGV[i] end
return forget_members({ pending = KEYS[1], leased = KEYS[2], owners = KEYS[3], attempts = KEYS[4],
                        first_failure = KEYS[5], takeovers = KEYS[6], busy = KEYS[7], held = KEYS[8] },
                      ARGV[1], members)
