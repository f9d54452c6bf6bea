--[[
  Claim due members into the lease set, atomically and in a bounded batch.

  KEYS[1] pending  sorted set: member = order id, score = deadline (ms)
  KEYS[2] leased   sorted set: member = order id, score = lease expiry (ms)
  ARGV[1] now      (ms): members with score <= now are due, leases <= now expired
  ARGV[2] limit    most members to claim
  ARGV[3] until    (ms): lease expiry given to every claimed member

  Returns { next, member... }: when nothing was claimed, next is the earliest
  score in either set ("" when both are empty), so an idle consumer learns how
  long to sleep from the same call; after a claim it is "" (the consumer claims
  again at once). Then the claimed members, expired leases first (their
  consumer died), then due members.
]]
local rcall = redis.call
local pending, leased = KEYS[1], KEYS[2]
local now, limit, lease_until = ARGV[1], tonumber(ARGV[2]), ARGV[3]

-- unpack() is bounded by Lua's C stack, so large batches go in slices.
local function zadd_all(key, score, members)
  local step = 500
  for i = 1, #members, step do
    local args = {}
    for j = i, math.min(i + step - 1, #members) do
      args[#args + 1] = score
      args[#args + 1] = members[j]
    end
    rcall('ZADD', key, unpack(args))
  end
end

local function zrem_all(key, members)
  local step = 500
  for i = 1, #members, step do
    rcall('ZREM', key, unpack(members, i, math.min(i + step - 1, #members)))
  end
end

-- The earliest { score string, number } of a set, or nil when it is empty.
local function first(key)
  local entry = rcall('ZRANGE', key, 0, 0, 'WITHSCORES')
  if #entry == 0 then return nil end
  return { entry[2], tonumber(entry[2]) }
end

local function earliest(a, b)
  if a == nil then return b end
  if b == nil or a[2] <= b[2] then return a end
  return b
end

-- Look before ranging: an idle claim costs two O(log n) reads and nothing else.
local now_number = tonumber(now)
local first_leased, first_pending = first(leased), first(pending)
local claimed, seen = {}, {}

if first_leased and first_leased[2] <= now_number then
  local expired = rcall('ZRANGEBYSCORE', leased, '-inf', now, 'LIMIT', 0, limit)
  for _, member in ipairs(expired) do
    seen[member] = true
    claimed[#claimed + 1] = member
  end
end

if first_pending and first_pending[2] <= now_number and #claimed < limit then
  local due = rcall('ZRANGEBYSCORE', pending, '-inf', now, 'LIMIT', 0, limit - #claimed)
  if #due > 0 then
    zrem_all(pending, due)
    for _, member in ipairs(due) do
      if not seen[member] then
        seen[member] = true
        claimed[#claimed + 1] = member
      end
    end
  end
end

local next_entry
if #claimed > 0 then
  zadd_all(leased, lease_until, claimed)
else
  next_entry = earliest(first_pending, first_leased)
end

local reply = { next_entry and next_entry[1] or '' }
for _, member in ipairs(claimed) do reply[#reply + 1] = member end
return reply
