"""The Redis side: every key, every script, the shards of each kind's queue, the clients.

Speaks only Redis and knows nothing of Django models: ``shards`` (one queue of
one kind, its shards and their scripts), ``lanes`` (every kind's shards as one
round a consumer goes), ``keys`` (every key, built in one place),
``scripts`` and ``lua/`` (one atomic step per file), ``clients`` (a cache
alias's client and the bounded one saves share), ``wakeups`` (pub/sub),
``probes`` (what ``check --deploy`` asks the server), ``errors``.
"""

from .errors import redis_errors
from .keys import CLOSE, NOTICE, REMIND, GlobalKeys, QueueKeys, shard_of
from .lanes import Lanes, ShardRota
from .scripts import SCRIPT_NAMES, load_script_source
from .shards import (
    BUSY,
    HELD,
    LOOK_NOW,
    MAX_SCORE,
    SCHEDULE_SLICE,
    SLICE,
    Claim,
    Position,
    QueueStats,
    Retry,
    Shard,
    TimeoutQueue,
    escaped,
)

__all__ = [
    "BUSY", "CLOSE", "HELD", "LOOK_NOW", "MAX_SCORE", "NOTICE", "REMIND", "SCHEDULE_SLICE", "SCRIPT_NAMES", "SLICE",
    "Claim", "GlobalKeys", "Lanes", "Position", "QueueKeys", "QueueStats", "Retry", "Shard", "ShardRota",
    "TimeoutQueue", "escaped", "load_script_source", "redis_errors", "shard_of",
]
