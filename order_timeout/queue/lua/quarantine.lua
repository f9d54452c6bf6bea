--[[
  Move members that name no order out of the queue, into its quarantine.

  KEYS[1] pending  KEYS[2] leased  KEYS[3] owners  KEYS[4] attempts
  KEYS[5] first_failure  KEYS[6] takeovers  KEYS[7] busy  KEYS[8] held
  KEYS[9] quarantine  sorted set: member = the member as Redis held it, score = when moved (ms)
  ARGV[1] now        (ms): the quarantine's score
  ARGV[2] max_score  (ms): the latest deadline a score can stand for (year 9999); any
                     member of pending or leased scored later (+inf) is moved too
  ARGV[3] token      the claim's token: a listed member is moved only while this claim
                     holds its lease (or no claim does, or token is "")
  ARGV[4..] members  members a consumer could not read as an order (at most queue.SLICE)

  The members are raw bytes (a member that is not UTF-8 cannot be a Python
  string): nothing here decodes them. Scores past max_score are looked for
  only at the far end of each set, a bounded ZRANGEBYSCORE, so a quarantine
  costs what it moves.
  Returns the number of members moved.
]]
--!include owners_as_table
local rcall = redis.call
local pending, leased, owners = KEYS[1], KEYS[2], KEYS[3]
local attempts, first_failure, takeovers, busy, held, quarantine =
  KEYS[4], KEYS[5], KEYS[6], KEYS[7], KEYS[8], KEYS[9]
local now, max_score, token = ARGV[1], ARGV[2], ARGV[3]
-- Most out-of-range members moved per set and call: the next claim moves the rest.
local sweep = 100

local moved = {}
for i = 4, #ARGV do
  local member = ARGV[i]
  local holder = rcall('HGET', owners, member)
  -- The owners hash's own field (an empty member's) holds no claim's token.
  if token == '' or not holder or holder == token or holder == OWNERS_AS_TABLE then
    moved[#moved + 1] = member
  end
end
for _, key in ipairs({ pending, leased }) do
  local far = rcall('ZRANGEBYSCORE', key, '(' .. max_score, '+inf', 'LIMIT', 0, sweep)
  for _, member in ipairs(far) do moved[#moved + 1] = member end
end
if #moved == 0 then return 0 end

for _, member in ipairs(moved) do
  rcall('ZREM', pending, member)
  rcall('ZREM', leased, member)
  rcall('HDEL', owners, member)
  rcall('HDEL', attempts, member)
  rcall('HDEL', first_failure, member)
  rcall('HDEL', takeovers, member)
  rcall('ZREM', busy, member)
  rcall('ZREM', held, member)
  rcall('ZADD', quarantine, now, member)
end
return #moved
