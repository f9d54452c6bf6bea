--[[
  Count a failed close of leased members and give each its next try.

  KEYS[1] pending        sorted set: member = order id, score = deadline (ms)
  KEYS[2] leased         sorted set: member = order id, score = lease expiry (ms)
  KEYS[3] attempts       hash: member = order id, value = failed attempts so far
  KEYS[4] first_failure  hash: member = order id, value = first failure (ms)
  ARGV[1] now (ms)
  ARGV[2] n, the number of retry delays; ARGV[3 .. 2+n] the delays (ms)
  ARGV[3+n ..] the members that failed

  A member with attempts <= n goes back to pending at now + its delay. One
  past the last delay stays leased, for the caller to write its dead letter
  and then bury it; if the caller dies first, the lease brings it back.
  Members no longer leased (paid and unscheduled meanwhile) are left alone.

  Returns { member, attempts, first_failure_ms, retry_at_ms or "" } per member
  handled, flattened.
]]
local rcall = redis.call
local pending, leased, attempts, first_failure = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local now = tonumber(ARGV[1])
local n = tonumber(ARGV[2])

local reply = {}
for i = 3 + n, #ARGV do
  local member = ARGV[i]
  if rcall('ZSCORE', leased, member) then
    local count = rcall('HINCRBY', attempts, member, 1)
    rcall('HSETNX', first_failure, member, now)
    local first = rcall('HGET', first_failure, member)
    local retry_at = ''
    if count <= n then
      retry_at = now + tonumber(ARGV[2 + count])
      rcall('ZREM', leased, member)
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
