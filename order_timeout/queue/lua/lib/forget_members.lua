--[[
  Included by the scripts that forget members (forget.lua, and claim.lua for the ack it carries):
  scripts.py puts this text where a script says `--!include forget_members`.

  forget_members(keys, token, members) forgets `members` whose orders are settled for good.
  `keys`: { pending, leased, owners, attempts, first_failure, takeovers, busy, held }.
  Each member leaves the pending set: another consumer that found the row locked while this one
  closed it may have put it back, and that is moot now. Its lease and its retry state go only if
  the lease is held by `token`, or by no claim at all, or `token` is "" (unschedule: no claim
  involved): a stale consumer cannot strip the lease of the claim that took its member over.
  A handful of variadic commands whatever the number of members (at most queue.SLICE).
  Returns the number of members whose lease and state were dropped.
]]
local function forget_members(keys, token, members)
  if #members == 0 then return 0 end
  redis.call('ZREM', keys.pending, unpack(members))
  local ours = members
  if token ~= '' then
    ours = {}
    local held_by, n = redis.call('HMGET', keys.owners, unpack(members)), 0
    for i = 1, #members do
      if not held_by[i] or held_by[i] == token then
        n = n + 1
        ours[n] = members[i]
      end
    end
    if #ours == 0 then return 0 end
  end
  redis.call('ZREM', keys.leased, unpack(ours))
  redis.call('HDEL', keys.owners, unpack(ours))
  -- With the shard's last lease, the owners hash's own field (lib/owners_as_table.lua): a shard
  -- that holds nothing keeps no key (the next lease makes the hash a table again).
  -- (ZCARD and HLEN rather than EXISTS: the least-privilege ACL rule of docs/operations.md has
  -- no EXISTS; each is O(1) and 0 for a key that does not exist.)
  if redis.call('ZCARD', keys.leased) == 0 then redis.call('HDEL', keys.owners, '') end
  -- Retry state is rare: a key that does not exist is not handed the batch's members.
  for _, held_state in ipairs({ keys.attempts, keys.first_failure, keys.takeovers }) do
    if redis.call('HLEN', held_state) > 0 then redis.call('HDEL', held_state, unpack(ours)) end
  end
  for _, marked in ipairs({ keys.busy, keys.held }) do
    if redis.call('ZCARD', marked) > 0 then redis.call('ZREM', marked, unpack(ours)) end
  end
  return #ours
end
