--[[
  Give leased members back to the pending set with new deadlines.

  KEYS[1] pending  sorted set: member = order id, score = deadline (ms)
  KEYS[2] leased   sorted set: member = order id, score = lease expiry (ms)
  KEYS[3] owners   hash: member = order id, value = token of the claim holding its lease
  KEYS[4] busy     sorted set: member = order id locked elsewhere, score = first time (ms)
  KEYS[5] held     sorted set: member = order id held by a payment in flight, score = first time (ms)
  ARGV[1] token    the claim's token
  ARGV[2] mark     why they go back: "busy" (their rows were locked by another
                   transaction), "held" (a payment in flight holds them), or ""
  ARGV[3] since    (ms) when that was found, or ""
  ARGV[4..]        score1, member1, score2, member2, ...

  A member goes back only if this claim still holds its lease: if the order
  was unscheduled meanwhile (paid), or another claim took the member over,
  it is not ours to move. LT keeps an earlier score already pending: the shop
  may have moved the deadline forward after we read the row, and too early
  costs one extra claim while too late would close the order late.
  A busy or held member is remembered in `busy` or `held` from the first time
  it was found so (so a row locked for ever, or a hold, shows up with its age);
  a put-back for another reason clears that mark.
  Returns the number of members put back.
]]
local rcall = redis.call
local pending, leased, owners, busy, held = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local token, mark, since = ARGV[1], ARGV[2], ARGV[3]
local moved = 0
for i = 4, #ARGV, 2 do
  local score, member = ARGV[i], ARGV[i + 1]
  local owner = rcall('HGET', owners, member)
  if (owner == token or not owner) and rcall('ZREM', leased, member) == 1 then
    rcall('HDEL', owners, member)
    rcall('ZADD', pending, 'LT', score, member)
    if mark == 'busy' then
      rcall('ZADD', busy, 'NX', since, member)
    else
      rcall('ZREM', busy, member)
    end
    if mark == 'held' then
      rcall('ZADD', held, 'NX', since, member)
    elseif mark == '' then
      rcall('ZREM', held, member)
    end
    moved = moved + 1
  end
end
return moved
