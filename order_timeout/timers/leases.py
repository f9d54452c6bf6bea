"""A watch over the batch in hand: keep its leases while it runs, give it up when it overruns.

A live consumer renews the leases of a batch still in progress every third of
``LEASE_SECONDS``, so nobody takes its members over while it works. A batch
still running ``BATCH_TIME_LIMIT`` after its claim is given up: its database
session is ended (the transaction rolls back and its row locks go, even if a
receiver hangs in Python) and its leases are handed to the next claim at
once, which takes the batch over (member by member if it dies again). A frozen consumer renews
nothing: its heartbeat stops (see ``heartbeats``), and the server's session
limits end its transaction. A batch with no session to name (``session_id`` gives none
behind a transaction pooler, where a backend pid is not ours to end) is
handed over all the same; the limits its transaction set end it server-side.

A receiver stuck in Python (no database call to fail) keeps its thread even
after that; no thread can be stopped from outside. A third of the time limit (at
least a second) after the give-up the guard reports it stuck, and
``run_timeout_consumer`` exits (``stuck.EXIT_STUCK``) so its supervisor
starts a fresh one; the culprit's next consumers do the same until
``MAX_TAKEOVERS`` buries it.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from ..db.session import end_session
from ..exceptions import QueueUnavailable
from ..queue import TimeoutQueue
from ..queue.keys import kind_name
from .watchdog import stuck_after

logger = logging.getLogger("order_timeout")


@dataclass
class WatchedBatch:
    token: str
    members: list[str]
    # time.monotonic() when the batch must be done
    deadline: float
    # the database session closing it, and the alias it belongs to
    session: Any = None
    using: str = "default"
    renewed_at: float = field(default_factory=time.monotonic)
    given_up: threading.Event = field(default_factory=threading.Event)
    # time.monotonic() of the give-up; the batch still in hand a while later is stuck
    given_up_at: float = 0.0
    reported_stuck: bool = False
    # The queue its members were claimed from (the closes', the reminders'); None: the guard's.
    queue: TimeoutQueue | None = None
    # time.monotonic() when it was put under watch, and how many of its keys' receivers have run
    # since (its act's ``progress``): how far a batch given up for time got (timers/sizing.py).
    started: float = field(default_factory=time.monotonic)
    done: int = 0

    def expired(self) -> bool:
        return self.given_up.is_set() or time.monotonic() >= self.deadline

    def advance(self) -> None:
        self.done += 1


class LeaseGuard:
    """One thread per consumer, watching one batch at a time."""

    def __init__(self, queue: TimeoutQueue, lease_seconds: float, clock_ms: Callable[[], int],
                 on_stuck: Callable[[WatchedBatch], None] | None = None,
                 end_session: Callable[[str, Any], bool] = end_session,
                 time_limit: float | None = None) -> None:
        self.queue = queue
        self.lease_seconds = lease_seconds
        # How long a batch may run from its claim (BATCH_TIME_LIMIT); None: its lease.
        self.time_limit = lease_seconds if time_limit is None else time_limit
        self.clock_ms = clock_ms
        self.on_stuck = on_stuck
        self.end_session = end_session
        self._batch: WatchedBatch | None = None
        self._lock = threading.Lock()
        self._changed = threading.Event()
        self._closed = threading.Event()
        self._thread: threading.Thread | None = None

    @contextmanager
    def watching(self, token: str, members: list[str], session: Any,
                 using: str, queue: TimeoutQueue | None = None) -> Iterator[WatchedBatch]:
        """Watch this batch for the block; once the block is left, ``given_up`` no longer changes.

        A batch given up must close its database connection once it leaves
        (the guard ends that session; nothing else may run on it).
        """
        batch = WatchedBatch(token, members, time.monotonic() + self.time_limit, session, using,
                             queue=queue)
        with self._lock:
            self._batch = batch
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="order-timeout-lease-guard",
                                                daemon=True)
                self._thread.start()
        self._changed.set()
        try:
            yield batch
        finally:
            with self._lock:
                self._batch = None
            self._changed.set()

    def close(self) -> None:
        self._closed.set()
        self._changed.set()
        if self._thread is not None:
            self._thread.join(5)

    def _run(self) -> None:
        while not self._closed.is_set():
            try:
                self._step()
            except Exception:
                # Whatever went wrong (a bug, a clock, a driver), the watch must go on: a
                # guard that died quietly would let a hung batch keep its leases for good.
                logger.exception("The lease guard failed a step; it goes on watching.")
                self._closed.wait(min(1.0, self.lease_seconds / 3))

    def _step(self) -> None:
        """One look at the batch in hand: renew its leases, give it up, or report it stuck."""
        renew_every = self.lease_seconds / 3
        stuck_seconds = stuck_after(self.time_limit)
        with self._lock:
            batch = self._batch
        if batch is None or batch.reported_stuck:
            self._wait(None)
            return
        now = time.monotonic()
        if batch.given_up.is_set():
            if now >= batch.given_up_at + stuck_seconds:
                self._stuck(batch)
            else:
                self._wait(batch.given_up_at + stuck_seconds)
            return
        if now >= batch.deadline:
            self._give_up(batch)
            return
        if now - batch.renewed_at >= renew_every:
            self._renew(batch)
        self._wait(min(batch.renewed_at + renew_every, batch.deadline))

    def _wait(self, until: float | None) -> None:
        """Sleep until ``until`` (monotonic; None: for ever) or a change of batch."""
        self._changed.wait(None if until is None else max(0.0, until - time.monotonic()))
        self._changed.clear()

    def _renew(self, batch: WatchedBatch) -> None:
        batch.renewed_at = time.monotonic()
        try:
            (batch.queue or self.queue).renew(batch.token, batch.members,
                                              self.clock_ms() + round(1000 * self.lease_seconds))
        except QueueUnavailable as exc:
            logger.warning("%s: could not renew the leases of the batch in hand (%s); trying again every %gs; "
                           "once they run out, another consumer may take the batch over.",
                           self._kind(batch), exc, self.lease_seconds / 3)

    def _give_up(self, batch: WatchedBatch) -> None:
        # Marked under the lock, so the mark is final once the batch is let go
        # (``watching`` clears it under the same lock): a batch that finished
        # first is not given up. The session is ended outside the lock, on a
        # connection of this thread's own (which may take a while to open):
        # a batch given up closes its connection as it leaves, so its session
        # never serves another statement (a dead letter's INSERT, a new batch)
        # that the kill could hit, and the batch need not wait for the kill.
        with self._lock:
            if self._batch is not batch:
                return
            batch.given_up.set()
            batch.given_up_at = time.monotonic()
        logger.warning(
            "%s: a batch of %d still running after BATCH_TIME_LIMIT (%gs): giving it up; %s, and its "
            "members are taken over as a batch, then one at a time if it dies again.",
            self._kind(batch), len(batch.members), self.time_limit,
            "its database session is ended" if batch.session is not None
            else "its transaction is left to the server's time limits")
        if batch.session is not None:
            self.end_session(batch.using, batch.session)
        try:
            (batch.queue or self.queue).hand_over(batch.token, batch.members, self.clock_ms())
        except QueueUnavailable as exc:
            logger.warning("%s: could not hand over the leases of the batch given up (%s); its members are "
                           "taken over once their leases run out.", self._kind(batch), exc)

    def _kind(self, batch: WatchedBatch) -> str:
        """The batch's kind, as every line about it names it ("close", "reminders", a timer's name)."""
        return kind_name((batch.queue or self.queue).kind)

    def _stuck(self, batch: WatchedBatch) -> None:
        batch.reported_stuck = True
        logger.critical(
            "%s: the batch given up %.1fs ago is still in hand: a receiver is stuck outside the "
            "database (members %s). This consumer can close nothing more.",
            self._kind(batch), time.monotonic() - batch.given_up_at,
            ", ".join(batch.members[:20]))
        if self.on_stuck is not None:
            self.on_stuck(batch)
