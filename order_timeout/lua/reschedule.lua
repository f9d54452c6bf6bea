--[[
  Give leased members back to the pending set with new deadlines.

  KEYS[1] pending  sorted set: member = order id, score = deadline (ms)
  KEYS[2] leased   sorted set: member = order id, score = lease expiry (ms)
  KEYS[3] owners   hash: member = order id, value = token of the claim holding its lease
  KEYS[4] busy     sorted set: member = order id locked elsewhere, score = first time (ms)
  ARGV[1] token    the claim's token
  ARGV[2] busy_at  (ms) when the rows were found locked by another transaction, or ""
  ARGV[3..]        score1, member1, score2, member2, ...

  A member goes back only if this claim still holds its lease: if the order
  was unscheduled meanwhile (paid), or another claim took the member over,
  it is not ours to move. LT keeps an earlier score already pending: the shop
  may have moved the deadline forward after we read the row, and too early
  costs one extra claim while too late would close the order late.
  A busy member is remembered in `busy` from the first time it was found
  locked (so a row held for ever shows up); any other put-back clears that.
  Returns the number of members put back.
]]
local rcall = redis.call
local pending, leased, owners, busy = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local token, busy_at = ARGV[1], ARGV[2]
local moved = 0
for i = 3, #ARGV, 2 do
  local score, member = ARGV[i], ARGV[i + 1]
  local owner = rcall('HGET', owners, member)
  if (owner == token or not owner) and rcall('ZREM', leased, member) == 1 then
    rcall('HDEL', owners, member)
    rcall('ZADD', pending, 'LT', score, member)
    if busy_at ~= '' then
      rcall('ZADD', busy, 'NX', busy_at, member)
    else
      rcall('ZREM', busy, member)
    end
    moved = moved + 1
  end
end
return moved
