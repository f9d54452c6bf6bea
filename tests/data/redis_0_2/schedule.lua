--[[
  Add members at their deadlines (or move them earlier), and wake the sleeping
  consumers when one of them became the earliest deadline of all.

  KEYS[1] pending  sorted set: member = order id, score = deadline (ms)
  KEYS[2] wake     pub/sub channel the consumers listen on: sharded pub/sub
                   (SPUBLISH, same slot as the keys) on Redis 7 and later,
                   plain PUBLISH before
  ARGV    score1, member1, score2, member2, ...

  LT: a member already pending only ever moves earlier. Two deadline changes
  of one order that commit close together may reach Redis in either order;
  with LT the score is never later than any deadline the row held since the
  member was added, so never later than the row. An extension is taken up at
  the old deadline, when the consumer reads the row and puts the member back
  at the new one: early costs one look, late would close the order late.

  A consumer with nothing due sleeps until the earliest deadline it knows of;
  a new earlier one would otherwise wait for its MAX_WAIT. Publishing only
  when the head of the set changed keeps the usual create (a deadline far
  behind others) at one ZADD.
  Returns the number of members added (not moved).
]]
local rcall = redis.call
local pending, wake = KEYS[1], KEYS[2]

-- One variadic ZADD per 500 members (unpack() is bounded by Lua's C stack).
local added, earliest = 0, nil
for i = 1, #ARGV, 1000 do
  added = added + rcall('ZADD', pending, 'LT', unpack(ARGV, i, math.min(i + 999, #ARGV)))
end
for i = 1, #ARGV, 2 do
  local score = tonumber(ARGV[i])
  if earliest == nil or score < earliest then earliest = score end
end

local head = rcall('ZRANGE', pending, 0, 0, 'WITHSCORES')
if earliest and #head > 0 and tonumber(head[2]) >= earliest then
  if redis.REDIS_VERSION_NUM and redis.REDIS_VERSION_NUM >= 0x070000 then
    rcall('SPUBLISH', wake, head[2])
  else
    rcall('PUBLISH', wake, head[2])
  end
end
return added
