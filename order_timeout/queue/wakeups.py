"""Wake-ups: a thread that listens for new earliest deadlines and tells the sleeping consumer.

Each shard publishes on its own channel when a new deadline becomes its
earliest (``lua/schedule.lua``): sharded pub/sub (``SSUBSCRIBE``) on Redis 7
and later, so in a Cluster the message stays on the shard's own master; plain
pub/sub before. The thread asks the server's version the way the script does
(``lua/version.lua``), not with INFO, which ACL rules such as
``-@dangerous`` refuse. When the subscription breaks (a failover, a
restart), the thread builds it again, against whatever node holds the slots
now; until it is back, the consumer still wakes every ``MAX_WAIT``. Each
channel the server confirms, first or again, wakes its lane at once: what was
published while it was down reached nobody. When the
user may not subscribe at all (a refused command or channel), the thread
says so once and ends: retrying cannot help, and the consumer polls every
``MAX_WAIT``.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

from redis.cluster import RedisCluster
from redis.exceptions import NoPermissionError, RedisClusterException, RedisError

from .lanes import Lanes
from .probes import sharded_pubsub
from .shards import TimeoutQueue

logger = logging.getLogger("order_timeout")

# Seconds between attempts to build a broken subscription again.
RESUBSCRIBE_AFTER = 1.0


class WakeListener:
    """Calls ``on_wake(lane)`` whenever a shard schedules a new earliest deadline.

    ``queue`` is a ``TimeoutQueue`` (lane = shard index) or the ``Lanes`` of
    several kinds of timer (lane = the shard's place among them).
    """

    def __init__(self, queue: TimeoutQueue | Lanes, on_wake: Callable[[int], None]) -> None:
        self.queue = queue
        self.on_wake = on_wake
        self._channels = {shard.keys.wake: lane for lane, shard in enumerate(queue.shards)}
        self._closed = threading.Event()
        self._pubsub: Any = None
        # Channels the server has confirmed since the subscription was (re)built.
        self._confirmed: set[str] = set()
        self._sharded: bool | None = None
        self._cluster = isinstance(queue.client, RedisCluster)
        self._failing = False
        # Why the wake-ups are off for good (the user may not subscribe), or None.
        self.refused: str | None = None
        self.thread = threading.Thread(target=self._run, name="order-timeout-wakeups", daemon=True)
        self.thread.start()

    def close(self) -> None:
        self._closed.set()
        self.thread.join(5)
        self._drop()

    @property
    def subscribed(self) -> bool:
        """The server has confirmed every channel: a deadline scheduled from now on wakes the consumer."""
        return self._pubsub is not None and len(self._confirmed) == len(self._channels)

    def _run(self) -> None:
        while not self._closed.is_set():
            try:
                if self._pubsub is None:
                    self._subscribe()
                message = self._next_message()
            except NoPermissionError as exc:
                self._give_up(exc)
                return
            except (RedisError, RedisClusterException, OSError, ValueError) as exc:
                if not self._failing:
                    logger.warning("Lost the wake-up subscription (%s: %s); building it again every "
                                   "%gs; meanwhile new early deadlines wait up to MAX_WAIT.",
                                   type(exc).__name__, exc, RESUBSCRIBE_AFTER)
                self._failing = True
                self._drop()
                self._closed.wait(RESUBSCRIBE_AFTER)
                continue
            if self._failing and self.subscribed:
                logger.info("Wake-up subscription back.")
                self._failing = False
            if message:
                self._handle(message)

    def _handle(self, message: dict[str, Any]) -> None:
        channel = message["channel"]
        channel = channel.decode() if isinstance(channel, bytes) else channel
        if message.get("type") in ("subscribe", "ssubscribe"):
            self._confirmed.add(channel)
            # A deadline published while this channel was not subscribed reached nobody
            # (a first start, a failover, a restart, redis-py's own reconnect): look at
            # the lane now, as its message would have made us.
            if channel in self._channels:
                self.on_wake(self._channels[channel])
        elif message.get("type") in ("message", "smessage") and channel in self._channels:
            self.on_wake(self._channels[channel])

    def _give_up(self, exc: NoPermissionError) -> None:
        what = "SSUBSCRIBE" if self._sharded else "SUBSCRIBE" if self._sharded is not None else "EVALSHA"
        self.refused = f"{what}: {exc}"
        logger.error("The queue's Redis user may not run %s on the wake-up channels (%s): the wake-ups "
                     "are off, and this consumer notices a new early deadline only every MAX_WAIT. Grant "
                     "it (docs/operations.md, Redis; manage.py check --deploy lists what is missing) and "
                     "restart the consumer.", what, exc)
        self._drop()

    def _subscribe(self) -> None:
        client = self.queue.client
        if self._sharded is None:
            self._sharded = sharded_pubsub(client, self.queue.shards[0].keys.wake)
        self._confirmed = set()
        pubsub = client.pubsub()
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
        self._confirmed = set()
        if pubsub is not None:
            try:
                pubsub.close()
            except (RedisError, RedisClusterException, OSError):
                pass
