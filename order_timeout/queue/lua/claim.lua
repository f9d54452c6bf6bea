--[[
  Claim due members into the lease set, atomically and in a bounded batch.

  KEYS[1] pending    sorted set: member = order id, score = deadline (ms)
  KEYS[2] leased     sorted set: member = order id, score = lease expiry (ms)
  KEYS[3] owners     hash: member = order id, value = token of the claim holding its lease
  KEYS[4] takeovers  hash: member = order id, value = times its lease was taken over
  KEYS[5..8]         attempts, first_failure, busy, held: what an ack forgets with the lease
  KEYS[9]  paused    string, set while staff keep this kind paused (models.Pause holds the
                     truth): nothing is claimed, neither due members nor expired leases, and
                     `next` is "" (the consumer learns of the pause at its next heartbeat and
                     stops asking; till then it asks once a MAX_WAIT). The ack still goes.
  ARGV[1] now        (ms): members with score <= now are due, leases <= now expired
  ARGV[2] limit      most members to claim
  ARGV[3] until      (ms): lease expiry given to every claimed member
  ARGV[4] token      this claim's token: ack, retry and reschedule must show it
  ARGV[5] turn       "takeover": expired leases first; "due": due pending members first
                     (the consumer alternates, so neither waits behind all of the other)
  ARGV[6] ack token  the token of this consumer's last batch on this shard, committed since
                     ("" for none): its members, ARGV[7], are acked in the same call, as
                     forget.lua acks them, so a consumer that goes straight on pays one round
                     trip a batch. After a claim of due members: the lease set then never
                     empties between two batches, and Redis builds a sorted set anew as a
                     listpack, scanned at each of its first 128 adds (a batch of 500 leased at
                     1.3 us a member into a new set, 0.4 into one that lives). Before a
                     takeover, whose expired lease may be the acked batch's own (committed,
                     then late), and before the next score is read when nothing is claimed.
  ARGV[7]            the members to ack (at most queue.SLICE), one argument, each ended by a
                     newline (no member holds one): one string to send, not one per member
  ARGV[8] held since (ms) when the same batch found the members of ARGV[9] held ("" for none)
  ARGV[9]            that batch's members held by a payment in flight, each with its next look:
                     "score\nmember\n" for each (at most queue.SLICE), put back to pending as
                     reschedule.lua puts back a held member, but only where `owners` still names
                     the carried token (lib/put_back.lua): carried, as the ack is, so a batch
                     with a hold costs no round trip more than one without

  Returns { next, takeovers, member... }:
  - Expired leases (their consumer died, froze or overran) are taken over. The first time a
    batch dies it is taken over whole: the members of the earliest expired lease that share
    its lease score and its token, at most `limit` (a crash costs one claim, not one per
    member). A member taken over before is taken over alone: whatever kills its holders then
    stalls only itself, and the rest of its dead batch is left expired under the token
    "~" .. token, each taken alone at the next claims and never judged for that death. Each
    member's takeover count rises by one. `takeovers` is that count when the member died
    alone with its holder (the one case the caller may give it up in: nothing else was in
    its batch), and minus that count otherwise.
  - Or the due pending members, at most `limit`, deadline first. A member taken over before
    is claimed alone: the batch stops before it, or, when it comes first, it is the batch
    (`takeovers` is then minus its count: claimed from pending, it did not die this time).
  - Nothing claimed: `next` is the earliest score in either set ("" when both
    are empty), so an idle consumer learns how long to sleep from the same
    call; `takeovers` is 0.
]]
--!include forget_members
--!include owners_as_table
--!include put_back
local rcall = redis.call
local pending, leased, owners, takeovers = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local now, limit, lease_until, token, turn = ARGV[1], tonumber(ARGV[2]), ARGV[3], ARGV[4], ARGV[5]

-- A newline-ended list (ARGV[7], ARGV[9]) as a table.
local function lines(text)
  local items, n = {}, 0
  for item in string.gmatch(text, '([^\n]*)\n') do
    n = n + 1
    items[n] = item
  end
  return items
end

-- What the call carries of the last batch: its ack (ARGV[6], ARGV[7]), its held members (ARGV[8],
-- ARGV[9]).
local function ack()
  if ARGV[7] and ARGV[7] ~= '' then
    forget_members({ pending = pending, leased = leased, owners = owners, takeovers = takeovers,
                     attempts = KEYS[5], first_failure = KEYS[6], busy = KEYS[7], held = KEYS[8] },
                   ARGV[6], lines(ARGV[7]))
  end
  if ARGV[9] and ARGV[9] ~= '' then
    put_back({ pending = pending, leased = leased, owners = owners, busy = KEYS[7], held = KEYS[8] },
             ARGV[6], 'held', ARGV[8], lines(ARGV[9]), 1, true)
  end
end
local now_number = tonumber(now)
-- unpack() is bounded by Lua's C stack, so large batches go in slices.
local step = 500

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

local function lease(members)
  if #members > 0 then owners_as_table(owners) end
  for i = 1, #members, step do
    -- Counted, not appended with #: a table's length is a search.
    local scored, owned, n = {}, {}, 0
    for j = i, math.min(i + step - 1, #members) do
      scored[n + 1], scored[n + 2] = lease_until, members[j]
      owned[n + 1], owned[n + 2] = members[j], token
      n = n + 2
    end
    rcall('ZADD', leased, unpack(scored))
    rcall('HSET', owners, unpack(owned))
  end
end

-- Look before ranging: an idle claim costs two O(log n) reads and nothing else.
local first_leased, first_pending = first(leased), first(pending)

-- A half of a split batch that was never tried alone: its token's mark.
local UNTRIED = '~'

local function take_over()
  local entry = rcall('ZRANGEBYSCORE', leased, '-inf', now, 'WITHSCORES', 'LIMIT', 0, 1)
  local member, score = entry[1], entry[2]
  local dead = rcall('HGET', owners, member)
  local group = { member }
  if dead then
    -- Its batch: the members its dead claim leased together share the lease score (a claim,
    -- a renewal and a hand-over each give a whole batch one expiry). Read a few batches' worth:
    -- other claims' members can share the score, and what is missed is taken over later.
    group = {}
    local same = rcall('ZRANGEBYSCORE', leased, score, score, 'LIMIT', 0, 4 * limit)
    for i = 1, #same, step do
      local tokens = rcall('HMGET', owners, unpack(same, i, math.min(i + step - 1, #same)))
      for j = 1, #tokens do
        if tokens[j] == dead and #group < limit then group[#group + 1] = same[i + j - 1] end
      end
    end
  end
  local before = tonumber(rcall('HGET', takeovers, member) or '0')
  local untried = dead and string.sub(dead, 1, #UNTRIED) == UNTRIED
  local alone = #group == 1 and not untried
  if before > 0 then
    -- A takeover that died too (or a member of one): this member alone; the rest of its dead
    -- batch marked, so that each, taken alone in turn, is not judged for a death it shared.
    if not untried and #group > 1 then
      local rest = {}
      for i = 2, #group do
        rest[#rest + 1] = group[i]
        rest[#rest + 1] = UNTRIED .. dead
      end
      for i = 1, #rest, 2 * step do
        rcall('HSET', owners, unpack(rest, i, math.min(i + 2 * step - 1, #rest)))
      end
    end
    group = { member }
  end
  local count = 0
  for _, taken in ipairs(group) do
    local raised = rcall('HINCRBY', takeovers, taken, 1)
    if taken == member then count = raised end
  end
  lease(group)
  local reply = { '', alone and count or -count }
  for _, taken in ipairs(group) do reply[#reply + 1] = taken end
  return reply
end

local function claim_due()
  local due = rcall('ZRANGEBYSCORE', pending, '-inf', now, 'LIMIT', 0, limit)
  -- Where the first member taken over before sits in the batch, if any.
  local tainted_at, tainted_count = nil, 0
  if rcall('HLEN', takeovers) > 0 then
    for i = 1, #due, step do
      local counts = rcall('HMGET', takeovers, unpack(due, i, math.min(i + step - 1, #due)))
      for j = 1, #counts do
        if counts[j] then
          tainted_at, tainted_count = i + j - 1, tonumber(counts[j])
          break
        end
      end
      if tainted_at then break end
    end
  end
  local batch = due
  if tainted_at == 1 then
    batch, tainted_count = { due[1] }, -tainted_count
  elseif tainted_at then
    batch, tainted_count = {}, 0
    for i = 1, tainted_at - 1 do batch[i] = due[i] end
  end
  for i = 1, #batch, step do
    rcall('ZREM', pending, unpack(batch, i, math.min(i + step - 1, #batch)))
  end
  lease(batch)
  local reply = { '', tainted_count }
  for i = 1, #batch do reply[i + 2] = batch[i] end
  return reply
end

-- GET, not EXISTS: the least-privilege ACL rule docs/operations.md gives (and 0.2 gave) has no EXISTS.
if rcall('GET', KEYS[9]) then
  ack()
  return { '', 0 }
end

local expired = first_leased and first_leased[2] <= now_number
local due = first_pending and first_pending[2] <= now_number
if due and not (expired and turn ~= 'due') then
  local reply = claim_due()
  ack()
  return reply
end
ack()
first_leased = first(leased)
-- The held members it carried went back to pending: the next score may be theirs.
if ARGV[9] and ARGV[9] ~= '' then first_pending = first(pending) end
if first_leased and first_leased[2] <= now_number then return take_over() end
if due then return claim_due() end

local next_entry = earliest(first_pending, first_leased)
return { next_entry and next_entry[1] or '', 0 }
