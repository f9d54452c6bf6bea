--[[
  Included by the scripts that give leased members back to pending (reschedule.lua, and claim.lua
  for the held members it carries): scripts.py puts this text where a script says
  `--!include put_back`.

  put_back(keys, token, mark, since, entries, from, strict) moves each member of `entries`
  (score1, member1, score2, member2, ... from index `from`) back to the pending set at its score,
  only where this claim still holds its lease: the owners hash names `token` (or, unless
  `strict`, names no claim). If the order was unscheduled meanwhile (paid), or another claim took
  the member over, it is not ours to move. LT keeps an earlier score already pending: the shop
  may have moved the deadline forward after we read the row, and too early costs one extra claim
  while too late would close the order late.
  `keys`: { pending, leased, owners, busy, held }. `mark` says why: "busy" (the row was locked by
  another transaction), "held" (a payment in flight holds it), or "": a busy or held member is
  remembered in `busy` or `held` from `since`, the first time it was found so (a row locked for
  ever, or a hold, shows up with its age); a put-back for another reason clears that mark.
  Returns the number of members put back.
]]
local function put_back(keys, token, mark, since, entries, from, strict)
  local moved = 0
  for i = from, #entries, 2 do
    local score, member = entries[i], entries[i + 1]
    local owner = redis.call('HGET', keys.owners, member)
    if (owner == token or (not owner and not strict)) and redis.call('ZREM', keys.leased, member) == 1 then
      redis.call('HDEL', keys.owners, member)
      redis.call('ZADD', keys.pending, 'LT', score, member)
      if mark == 'busy' then
        redis.call('ZADD', keys.busy, 'NX', since, member)
      else
        redis.call('ZREM', keys.busy, member)
      end
      if mark == 'held' then
        redis.call('ZADD', keys.held, 'NX', since, member)
      elseif mark == '' then
        redis.call('ZREM', keys.held, member)
      end
      moved = moved + 1
    end
  end
  return moved
end
