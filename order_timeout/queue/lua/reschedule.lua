--[[
  Give leased members back to the pending set with new deadlines.

  KEYS[1] pending  sorted set: member = order id, score = deadline (ms)
  KEYS[2] leased   sorted set: member = order id, score = lease expiry (ms)
  KEYS[3] owners   hash: member = order id, value = token of the claim holding its lease
  KEYS[4] busy     sorted set: member = order id locked elsewhere, score = first time (ms)
  KEYS[5] held     sorted set: member = order id held by a payment in flight, score = first time (ms)
  ARGV[1] token    the claim's token
  ARGV[2] mark     why they go back: "busy" (their rows were locked by another
                   transaction), "held" (a payment in flight holds them), or ""
  ARGV[3] since    (ms) when that was found, or ""
  ARGV[4..]        score1, member1, score2, member2, ...

  A member goes back only if this claim still holds its lease (lib/put_back.lua), or no claim
  names it (a lease from before the owners hash).
  Returns the number of members put back.
]]
--!include put_back
return put_back({ pending = KEYS[1], leased = KEYS[2], owners = KEYS[3], busy = KEYS[4], held = KEYS[5] },
                ARGV[1], ARGV[2], ARGV[3], ARGV, 4, false)
