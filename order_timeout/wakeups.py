"""Wake-ups: a thread that listens for new earliest deadlines and tells the sleeping consumer.

Each shard publishes on its own channel when a new deadline becomes its
earliest (``lua/schedule.lua``): sharded pub/sub (``SSUBSCRIBE``) on Redis 7
and later, so in a Cluster the message stays on the shard's own master; plain
pub/sub before. When the subscription breaks (a failover, a restart), the
thread builds it again, against whatever node holds the slots now; until it
is back, the consumer still wakes every ``MAX_WAIT``.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

from redis.cluster import RedisCluster
from redis.exceptions import RedisClusterException, RedisError

from .queue import TimeoutQueue

logger = logging.getLogger("order_timeout")

# Seconds between attempts to build a broken subscription again.
RESUBSCRIBE_AFTER = 1.0


def supports_sharded_pubsub(client: Any) -> bool:
    """Redis 7 and later (SSUBSCRIBE, SPUBLISH)."""
    info = client.info("server")
    if isinstance(info, dict) and "redis_version" not in info:  # a Cluster: one reply per node
        info = next(iter(info.values()))
    major = int(str(info["redis_version"]).split(".")[0])
    return major >= 7


class WakeListener:
    """Calls ``on_wake(shard_index)`` whenever a shard schedules a new earliest deadline."""

    def __init__(self, queue: TimeoutQueue, on_wake: Callable[[int], None]) -> None:
        self.queue = queue
        self.on_wake = on_wake
        self._channels = {shard.keys.wake: shard.index for shard in queue.shards}
        self._closed = threading.Event()
        self._pubsub: Any = None
        self._sharded: bool | None = None
        self._cluster = isinstance(queue.client, RedisCluster)
        self._failing = False
        self.thread = threading.Thread(target=self._run, name="order-timeout-wakeups", daemon=True)
        self.thread.start()

    def close(self) -> None:
        self._closed.set()
        self.thread.join(5)
        self._drop()

    @property
    def subscribed(self) -> bool:
        return self._pubsub is not None

    def _run(self) -> None:
        while not self._closed.is_set():
            try:
                if self._pubsub is None:
                    self._subscribe()
                message = self._next_message()
            except (RedisError, RedisClusterException, OSError, ValueError) as exc:
                if not self._failing:
                    logger.warning("Lost the wake-up subscription (%s: %s); building it again every "
                                   "%gs; meanwhile new early deadlines wait up to MAX_WAIT.",
                                   type(exc).__name__, exc, RESUBSCRIBE_AFTER)
                self._failing = True
                self._drop()
                self._closed.wait(RESUBSCRIBE_AFTER)
                continue
            if self._failing:
                logger.info("Wake-up subscription back.")
                self._failing = False
            if message and message.get("type") in ("message", "smessage"):
                channel = message["channel"]
                channel = channel.decode() if isinstance(channel, bytes) else channel
                if channel in self._channels:
                    self.on_wake(self._channels[channel])

    def _subscribe(self) -> None:
        client = self.queue.client
        if self._sharded is None:
            self._sharded = supports_sharded_pubsub(client)
        pubsub = client.pubsub(ignore_subscribe_messages=True)
        try:
            if self._sharded:
                pubsub.ssubscribe(*self._channels)
            else:
                pubsub.subscribe(*self._channels)
        except BaseException:
            pubsub.close()
            raise
        self._pubsub = pubsub

    def _next_message(self) -> Any:
        if self._sharded:
            # A Cluster's sharded subscription is one connection per master, read in
            # turn, each for this long: short, so no master's message waits for the others.
            return self._pubsub.get_sharded_message(timeout=0.05 if self._cluster else 1.0)
        return self._pubsub.get_message(timeout=1.0)

    def _drop(self) -> None:
        pubsub, self._pubsub = self._pubsub, None
        if pubsub is not None:
            try:
                pubsub.close()
            except (RedisError, RedisClusterException, OSError):
                pass
