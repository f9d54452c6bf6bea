--[[
  Count a failed close of leased members and give each its next try.

  KEYS[1] pending        sorted set: member = order id, score = deadline (ms)
  KEYS[2] leased         sorted set: member = order id, score = lease expiry (ms)
  KEYS[3] owners         hash: member = order id, value = token of the claim holding its lease
  KEYS[4] attempts       hash: member = order id, value = failed attempts so far
  KEYS[5] first_failure  hash: member = order id, value = first failure (ms)
  KEYS[6] busy           sorted set: member = order id locked elsewhere, score = first time (ms)
  KEYS[7] held           sorted set: member = order id held by a payment in flight, score = first time (ms)
  ARGV[1] token          the claim's token
  ARGV[2] now (ms)
  ARGV[3] n, the number of retry delays; ARGV[4 .. 3+n] the delays (ms)
  ARGV[4+n ..] the members that failed

  A member with attempts <= n goes back to pending at now + its delay. One
  past the last delay stays leased, for the caller to write its dead letter
  and then forget it; if the caller dies first, the lease brings it back.
  Members whose lease this claim no longer holds (paid and unscheduled, or
  taken over by another claim) are left alone. A member retried is no longer
  busy nor held: its row was not locked elsewhere, nor held, this time.

  Returns { member, attempts, first_failure_ms, retry_at_ms or "" } per member
  handled, flattened.
]]
local rcall = redis.call
local pending, leased, owners, attempts, first_failure = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local busy, held = KEYS[6], KEYS[7]
local token = ARGV[1]
local now = tonumber(ARGV[2])
local n = tonumber(ARGV[3])

local reply = {}
for i = 4 + n, #ARGV do
  local member = ARGV[i]
  local owner = rcall('HGET', owners, member)
  if (owner == token or not owner) and rcall('ZSCORE', leased, member) then
    local count = rcall('HINCRBY', attempts, member, 1)
    rcall('ZREM', busy, member)
    rcall('ZREM', held, member)
    rcall('HSETNX', first_failure, member, now)
    local first = rcall('HGET', first_failure, member)
    local retry_at = ''
    if count <= n then
      retry_at = now + tonumber(ARGV[3 + count])
      rcall('ZREM', leased, member)
      rcall('HDEL', owners, member)
      rcall('ZADD', pending, retry_at, member)
      retry_at = tostring(retry_at)
    end
    reply[#reply + 1] = member
    reply[#reply + 1] = count
    reply[#reply + 1] = first
    reply[#reply + 1] = retry_at
  end
end
return reply
