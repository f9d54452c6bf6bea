--[[
  The server's version as the scripts see it, so that the wake-up thread makes
  the choice schedule.lua makes: SSUBSCRIBE where it SPUBLISHes (Redis 7 and
  later), SUBSCRIBE where it PUBLISHes. A script runs for any user the queue
  works for; INFO is often refused (ACL "-@dangerous").

  KEYS[1] any key of the shard (in a Cluster, it sends the call to the shard's master)
  ARGV    none
  Returns redis.REDIS_VERSION_NUM (0x070000 for 7.0.0), or 0 before Redis 7
]]
return redis.REDIS_VERSION_NUM or 0
