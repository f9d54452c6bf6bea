--[[
  Included by the scripts that lease members (claim.lua, take.lua): scripts.py puts this text
  where a script says `--!include owners_as_table`.

  owners_as_table(owners) keeps the owners hash a hash table. Redis keeps a hash of up to
  hash-max-listpack-entries (512 by default) short fields as a listpack, which it scans for
  every field set, read or deleted: a claim of 500 leased at 2.4 us a member and its ack read
  and dropped them at as much again, quadratic in the batch. A value longer than
  hash-max-listpack-value (64 bytes by default) makes a hash a hash table at once, and Redis
  never turns one back while its key lives, so the hash keeps this one field while the shard
  holds a lease: "", which no member names (a member is its row's key, never empty), whose value
  has no ':' (the heartbeat reads a token's consumer before its first ':') and is no claim's
  token (quarantine.lua takes it for no holder, were an empty member leased over it).
]]
local OWNERS_AS_TABLE = 'kept so that this hash stays a hash table (O(1) a field), never a listpack'
local function owners_as_table(owners)
  redis.call('HSET', owners, '', OWNERS_AS_TABLE)
end
