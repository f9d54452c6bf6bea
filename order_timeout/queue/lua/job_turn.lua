--[[
  Take a housekeeping job's turn for the whole fleet: its lock, if it is due and nobody holds it.

  The job is due when its last complete run started at least ``interval`` ago, by the database's
  clock (``now``, read by the caller: one clock for every host that runs it, the one every deadline
  is judged by). The lock is a lease
  with a fencing token: the runner renews it between chunks (renew_lock.lua) and records its end
  only while it still holds it (job_done.lua); once it lapses, the next runner takes it.

  KEYS[1] lock      string: the token of the job's runner
  KEYS[2] runs      hash: <job>:<field> for every job's last run
  ARGV[1] job       its name ("scan", "prune")
  ARGV[2] token     the would-be runner's token
  ARGV[3] ttl       the lock's time to live (ms)
  ARGV[4] interval  the job's interval (ms); 0: due whatever ran before (a run asked for by hand)
  ARGV[5] where     host:pid of the would-be runner
  ARGV[6] runner    what it is ("consumer", "beat", "command")
  ARGV[7] now       the database's time (ms)

  Returns {status, now_ms}: status 1 taken, 0 held by another runner, -1 not due yet.
]]
local rcall = redis.call
local now = tonumber(ARGV[7])
local job = ARGV[1]
if rcall('GET', KEYS[1]) then
  return {0, now}
end
local interval = tonumber(ARGV[4])
if interval > 0 then
  local last = tonumber(rcall('HGET', KEYS[2], job .. ':complete_started'))
  if last and now - last < interval then
    return {-1, now}
  end
end
rcall('SET', KEYS[1], ARGV[2], 'PX', ARGV[3])
rcall('HSET', KEYS[2], job .. ':started', now, job .. ':where', ARGV[5], job .. ':runner', ARGV[6],
      job .. ':token', ARGV[2])
rcall('HDEL', KEYS[2], job .. ':ended', job .. ':elapsed_ms', job .. ':complete', job .. ':figures')
return {1, now}
