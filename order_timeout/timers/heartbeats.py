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

A frozen consumer's open transaction would still hold its batch's row locks
until the server's own limit (``LEASE_SECONDS``) ended it, and the rows
would wait for it. So each beat also records the database session the
consumer's batch runs on (beating at once when it changes), and the consumer
that finds it dead ends that session: its transaction rolls back and the
locks go. PostgreSQL names it with its backend's start too, so a pid reused
by a stranger is never ended. A live consumer taken for dead (a pause longer
than ``HEARTBEAT_SECONDS``) loses that batch's work, never a close: the row
re-check decides as after any takeover.

Time is this host's, corrected to the database's (as the consumer's clock, but
never a test's stepped clock): every consumer then judges the others by the
same clock, whatever the skew between their hosts.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from django.db import connections

from ..db.session import end_session_named
from ..exceptions import QueueUnavailable
from ..queue.keys import kind_name
from ..queue.lanes import Lanes

logger = logging.getLogger("order_timeout")


class Heartbeat:
    """One thread per running consumer: beat on every lane, hand the dead's leases over."""

    def __init__(self, lanes: Lanes, consumer: str, seconds: float, clock_ms: Callable[[], int],
                 on_handed: Callable[[int], None] = lambda lane: None,
                 end_session: Callable[[str, str], bool] = end_session_named,
                 on_epoch_missing: Callable[[], None] = lambda: None,
                 on_beat: Callable[[], None] = lambda: None) -> None:
        self.lanes = lanes
        # Told each lane where leases were handed over: this consumer claims them next.
        self.on_handed = on_handed
        self.consumer = consumer
        self.seconds = seconds
        self.clock_ms = clock_ms
        self.end_session = end_session
        # Told when a shard has no epoch marker: Redis lost the queue (scans/recovery.py).
        self.on_epoch_missing = on_epoch_missing
        # Asked after every beat but the last (the consumer's look at the timers' pauses).
        self.on_beat = on_beat
        # "alias\x1fidentity" of the session this consumer's batch runs on; "" for none.
        self._session = ""
        self._closed = threading.Event()
        # Set to beat now: the session changed, or the consumer stops.
        self._poke = threading.Event()
        self._failing = False
        self.thread = threading.Thread(target=self._run, name="order-timeout-heartbeat", daemon=True)

    def start(self) -> None:
        """The first beat now, in the caller's thread (the consumer is alive before it claims),
        then one every third of ``seconds`` on the thread."""
        self.beat()
        self.thread.start()

    def close(self, abandon: bool = False) -> None:
        """Stop beating and leave every shard: a consumer that stopped is not dead. ``abandon``:
        it leaves mid-batch (a second signal, a crash), so it beats as dead instead, and its
        leases go to the next claims at once, not after LEASE_SECONDS."""
        self._closed.set()
        self._poke.set()
        if self.thread.is_alive():
            self.thread.join(5)
        if abandon:
            self._session = ""  # rolled back already (the batch's atomic block was left raising)
            self.beat(dead=True)
        else:
            self.beat(leaving=True)

    def record_session(self, using: str, identity: str | None) -> None:
        """The session this consumer's batches run on now; a new one is beaten at once, so it is
        known before the batch can freeze with it (save a few milliseconds)."""
        session = "" if identity is None else f"{using}\x1f{identity}"
        if session != self._session:
            self._session = session
            self._poke.set()

    def _run(self) -> None:
        while True:
            self._poke.wait(self.seconds / 3)
            self._poke.clear()
            if self._closed.is_set():
                return
            self.beat()

    def beat(self, leaving: bool = False, dead: bool = False) -> int:
        """Beat once on every lane; returns how many leases of dead consumers were handed over
        (``dead``: this one's own too, its heartbeat run out as it beats)."""
        handed = 0
        now = self.clock_ms()
        leaving = leaving or dead
        until = now - 1 if dead else None if leaving else now + round(1000 * self.seconds)
        sessions: set[str] = set()
        epoch_missing = False
        try:
            for lane, shard in enumerate(self.lanes.shards):
                beat = shard.heartbeat(self.consumer, now, until, self._session)
                moved = beat.handed
                sessions.update(beat.sessions)
                epoch_missing = epoch_missing or beat.epoch_missing
                if moved:
                    logger.warning("%s: a consumer's heartbeat stopped (shard %d): handed its %d lease(s) to "
                                   "the next claims.", kind_name(shard.keys.kind), shard.keys.shard, moved)
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
        for session in sessions:
            self._end(session)
        if epoch_missing and not leaving:
            self.on_epoch_missing()
        if not leaving:
            try:
                self.on_beat()
            except Exception:
                logger.exception("A heartbeat's look at the pauses failed; the next beat looks again.")
        return handed

    def _end(self, session: str) -> None:
        """End a dead consumer's session, so its rows are not locked until the server's limit."""
        using, _, identity = session.partition("\x1f")
        if using not in connections:
            return
        try:
            if self.end_session(using, identity):
                logger.warning("Ended the database session %s of a consumer whose heartbeat stopped: "
                               "its transaction rolled back, its row locks are gone.", identity)
        except Exception:
            logger.exception("Could not end the database session %s of a dead consumer.", identity)
