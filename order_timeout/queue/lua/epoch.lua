--[[
  The queue's epoch marker on one shard, stamped with the run id of the Redis server that wrote
  it: a server that restarted from a snapshot, or a replica promoted over its master, holds the
  marker with another server's stamp, and may have missed the last writes before it took over.

  KEYS[1] epoch   string: "<epoch> <run id>" (scans/recovery.py)
  ARGV[1] op      "read"; "mark": set it to ARGV[2], stamped; "claim": the same unless set
  ARGV[2] epoch   for mark and claim

  INFO is refused to a user without @dangerous (ACL): the stamp is then "-", and a marker with
  it is taken as this server's (only a missing marker tells the queue was lost).

  Returns { the epoch it holds ("" for none), 1 if stamped by this server else 0 }.
]]
local key, op, epoch = KEYS[1], ARGV[1], ARGV[2]

local info = redis.pcall('INFO', 'server')
local here = type(info) == 'string' and string.match(info, 'run_id:(%x+)') or '-'

if op == 'mark' then
  redis.call('SET', key, epoch .. ' ' .. here)
elseif op == 'claim' then
  redis.call('SET', key, epoch .. ' ' .. here, 'NX')
end
local marker = redis.call('GET', key)
if not marker then return { '', 0 } end
local held, stamp = string.match(marker, '^(%S+) (%S+)$')
if not held then return { marker, 0 } end
return { held, (stamp == here or stamp == '-' or here == '-') and 1 or 0 }
