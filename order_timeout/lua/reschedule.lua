--[[
  Give leased members back to the pending set with new deadlines.

  KEYS[1] pending  sorted set: member = order id, score = deadline (ms)
  KEYS[2] leased   sorted set: member = order id, score = lease expiry (ms)
  ARGV    score1, member1, score2, member2, ...

  A member goes back only if it is still leased: if the order was unscheduled
  meanwhile (paid), the lease is gone and the member must not come back. LT
  keeps an earlier score already pending: the shop may have moved the deadline
  forward after we read the row, and too early costs one extra claim while too
  late would close the order late.
  Returns the number of members put back.
]]
local rcall = redis.call
local pending, leased = KEYS[1], KEYS[2]
local moved = 0
for i = 1, #ARGV, 2 do
  local score, member = ARGV[i], ARGV[i + 1]
  if rcall('ZREM', leased, member) == 1 then
    rcall('ZADD', pending, 'LT', score, member)
    moved = moved + 1
  end
end
return moved
