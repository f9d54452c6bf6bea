--[[
  Record the end of a housekeeping job's run and release its lock, only while the run still holds
  the lock: a runner that froze past its lease (another took the job over) records nothing.

  KEYS[1] lock      string: the token of the job's runner
  KEYS[2] runs      hash: <job>:<field> for every job's last run
  ARGV[1] job       its name
  ARGV[2] token     the runner's token
  ARGV[3] complete  1 when the run did all it had to (the next is due an interval after it
                    started), 0 when it stopped early (the next runner goes on at once)
  ARGV[4] figures   what it did, a short JSON object
  ARGV[5] now       the database's time (ms)

  Returns 1 when recorded, 0 when the lock was no longer this run's.
]]
local rcall = redis.call
if rcall('GET', KEYS[1]) ~= ARGV[2] then
  return 0
end
local now = tonumber(ARGV[5])
local job = ARGV[1]
local started = tonumber(rcall('HGET', KEYS[2], job .. ':started')) or now
rcall('HSET', KEYS[2], job .. ':ended', now, job .. ':elapsed_ms', now - started,
      job .. ':complete', ARGV[3], job .. ':figures', ARGV[4])
if ARGV[3] == '1' then
  rcall('HSET', KEYS[2], job .. ':complete_started', started)
end
rcall('DEL', KEYS[1])
return 1
