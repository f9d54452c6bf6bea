"""A consumer's heartbeat: liveness apart from the lease.

A running consumer beats on every shard it serves, every third of
``HEARTBEAT_SECONDS``: its id in the shard's ``consumers`` set, scored with
when its heartbeat runs out. Each beat also looks for consumers whose
heartbeat ran out (killed, frozen by SIGSTOP or a paused VM, cut off from
Redis) and lets every lease their claims hold run out at once
(``lua/heartbeat.lua``), so the next claims take their members over in
seconds, not after ``LEASE_SECONDS``. The lease keeps its other job: it bounds
how long a live consumer's batch may run (``timers/leases.py``). A frozen
consumer that thaws finds its work refused by the claim token and the row
re-check, as after any takeover.

Time is this host's, corrected to the database's (as the consumer's clock, but
never a test's stepped clock): every consumer then judges the others by the
same clock, whatever the skew between their hosts.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from ..exceptions import QueueUnavailable
from ..queue.lanes import Lanes

logger = logging.getLogger("order_timeout")


class Heartbeat:
    """One thread per running consumer: beat on every lane, hand the dead's leases over."""

    def __init__(self, lanes: Lanes, consumer: str, seconds: float, clock_ms: Callable[[], int],
                 on_handed: Callable[[int], None] = lambda lane: None) -> None:
        self.lanes = lanes
        # Told each lane where leases were handed over: this consumer claims them next.
        self.on_handed = on_handed
        self.consumer = consumer
        self.seconds = seconds
        self.clock_ms = clock_ms
        self._closed = threading.Event()
        self._failing = False
        self.thread = threading.Thread(target=self._run, name="order-timeout-heartbeat", daemon=True)

    def start(self) -> None:
        """The first beat now, in the caller's thread (the consumer is alive before it claims),
        then one every third of ``seconds`` on the thread."""
        self.beat()
        self.thread.start()

    def close(self) -> None:
        """Stop beating and leave every shard: a consumer that stopped is not dead."""
        self._closed.set()
        if self.thread.is_alive():
            self.thread.join(5)
        self.beat(leaving=True)

    def _run(self) -> None:
        while not self._closed.wait(self.seconds / 3):
            self.beat()

    def beat(self, leaving: bool = False) -> int:
        """Beat once on every lane; returns how many leases of dead consumers were handed over."""
        handed = 0
        now = self.clock_ms()
        until = None if leaving else now + round(1000 * self.seconds)
        try:
            for lane, shard in enumerate(self.lanes.shards):
                moved = shard.heartbeat(self.consumer, now, until)
                if moved:
                    logger.warning("A consumer's heartbeat stopped (%s): handed its %d lease(s) to the "
                                   "next claims.", shard.keys.tag, moved)
                    self.on_handed(lane)
                handed += moved
        except QueueUnavailable as exc:
            if not self._failing and not leaving:
                logger.warning("Could not beat (%s); another consumer may take this one's batch over "
                               "once HEARTBEAT_SECONDS (%gs) pass without a beat.", exc, self.seconds)
            self._failing = True
            return handed
        except Exception:
            # The beat must go on whatever went wrong once (a bug, a driver): a consumer that
            # stopped beating quietly would have its batches taken from under it.
            logger.exception("The heartbeat failed a beat; it goes on.")
            return handed
        if self._failing:
            logger.info("Heartbeat back.")
            self._failing = False
        return handed
