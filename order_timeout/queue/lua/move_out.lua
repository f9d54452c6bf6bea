--[[
  Take members out of a shard of the old layout, once their copy is in the new one.

  KEYS[1] pending  KEYS[2] leased  KEYS[3] owners  KEYS[4] attempts
  KEYS[5] first_failure  KEYS[6] takeovers  KEYS[7] busy  KEYS[8] held
  ARGV[1] now (ms)
  ARGV[2..] member1, pending_score1, lease1, member2, ... ("" where there was none)

  A member leaves only as it was read: its pending score unchanged, or its
  lease unchanged and run out by now (a live lease stays with its consumer,
  to be moved by a later pass). Its retry state goes with it, and with the shard's last lease
  the owners hash's marker (lib/owners_as_table.lua): a layout left behind keeps no key.
  Returns the number of members taken out.
]]
local rcall = redis.call
local pending, leased, owners = KEYS[1], KEYS[2], KEYS[3]
local attempts, first_failure, takeovers, busy, held = KEYS[4], KEYS[5], KEYS[6], KEYS[7], KEYS[8]
local now = tonumber(ARGV[1])
local moved = 0
for i = 2, #ARGV, 3 do
  local member, score, lease = ARGV[i], ARGV[i + 1], ARGV[i + 2]
  local out = false
  if score ~= '' and rcall('ZSCORE', pending, member) == score then
    rcall('ZREM', pending, member)
    out = true
  end
  if lease ~= '' and tonumber(lease) <= now and rcall('ZSCORE', leased, member) == lease then
    rcall('ZREM', leased, member)
    rcall('HDEL', owners, member)
    out = true
  end
  if out and not rcall('ZSCORE', pending, member) and not rcall('ZSCORE', leased, member) then
    rcall('HDEL', attempts, member)
    rcall('HDEL', first_failure, member)
    rcall('HDEL', takeovers, member)
    rcall('ZREM', busy, member)
    rcall('ZREM', held, member)
    moved = moved + 1
  end
end
if rcall('ZCARD', leased) == 0 then rcall('HDEL', owners, '') end
return moved
