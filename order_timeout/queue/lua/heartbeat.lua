--[[
  A consumer's heartbeat on one shard, and the hand-over of the leases of the consumers whose
  heartbeat stopped (killed, frozen, cut off): liveness apart from the lease.

  KEYS[1] consumers  sorted set: member = consumer id, score = when its heartbeat runs out (ms)
  KEYS[2] leased     sorted set: member = order id, score = lease expiry (ms)
  KEYS[3] owners     hash: member = order id, value = token of the claim holding its lease
  KEYS[4] sessions   hash: member = consumer id, value = the database session its batch runs on
  KEYS[5] epoch      string: the queue's epoch and the run id of the server that wrote it (see
                     epoch.lua); missing on a queue Redis lost (or never set up), another
                     server's stamp on a Redis restarted from a snapshot or a replica promoted
  ARGV[1] now        (ms)
  ARGV[2] consumer   this consumer's id: the part of its claim tokens before the first ':'
  ARGV[3] until      (ms) when this heartbeat runs out; "" when the consumer leaves
  ARGV[4] session    the database session of this consumer's batch; "" for none

  A consumer whose heartbeat ran out is dead: every lease one of its claims holds runs out now
  (ZADD LT: a lease that ran out already keeps its earlier score), so the next claims take its
  members over, whatever LEASE_SECONDS said. Only a consumer that once beat can be found dead: a
  token of the compensation scan, or of a consumer of an older release, never is.

  A dead consumer's recorded session goes to the caller, to be ended: a frozen consumer's open
  transaction would keep its rows locked from the next holder until the server's own limit.

  Returns { leases handed over, 1 if the epoch marker is missing or another server's else 0, the
  dead consumers' sessions... }.
]]
local rcall = redis.call
local consumers, leased, owners, sessions, epoch = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local now, me, beat_until, session = ARGV[1], ARGV[2], ARGV[3], ARGV[4]

if beat_until == '' then
  rcall('ZREM', consumers, me)
else
  rcall('ZADD', consumers, beat_until, me)
end
if session == '' or beat_until == '' then
  rcall('HDEL', sessions, me)
else
  rcall('HSET', sessions, me, session)
end

local lost = 0
local marker = rcall('GET', epoch)
if not marker then
  lost = 1
else
  local stamp = string.match(marker, ' (%S+)$')
  if stamp ~= '-' then
    -- INFO refused (ACL without @dangerous): only a missing marker can tell, as epoch.lua says.
    local info = redis.pcall('INFO', 'server')
    local here = type(info) == 'string' and string.match(info, 'run_id:(%x+)')
    if here and stamp ~= here then lost = 1 end
  end
end
local dead_ids = rcall('ZRANGEBYSCORE', consumers, '-inf', '(' .. now)
if #dead_ids == 0 then return { 0, lost } end
local dead = {}
for _, id in ipairs(dead_ids) do dead[id] = true end

-- The leases in hand are a few batches (consumers x BATCH_SIZE), and a consumer dies seldom.
local handed = 0
local entries = rcall('HGETALL', owners)
for i = 1, #entries, 2 do
  local member, token = entries[i], entries[i + 1]
  local id = string.match(token, '^([^:]*):')
  if id and dead[id] then
    handed = handed + rcall('ZADD', leased, 'XX', 'LT', 'CH', now, member)
  end
end
local reply = { handed, lost }
for _, found in ipairs(rcall('HMGET', sessions, unpack(dead_ids))) do
  if found then reply[#reply + 1] = found end
end
rcall('HDEL', sessions, unpack(dead_ids))
rcall('ZREM', consumers, unpack(dead_ids))
return reply
