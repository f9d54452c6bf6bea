"""The consumer loop: claim due members, close their orders, ack; sleep until the next deadline.

Any number of consumers may run on any hosts: the claim script hands each
member to one of them, and the row lock in ``closing`` decides the rest. A
consumer that dies mid-batch loses nothing: its members stay leased and are
handed to another consumer once the lease runs out.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.db import DatabaseError, close_old_connections
from django.utils import timezone

from . import get_order_model
from .closing import CloseOutcome, close_expired
from .codec import deadline_score, now_score, parse_member
from .conf import settings
from .exceptions import QueueUnavailable
from .models import AbstractTimeoutOrder
from .queue import Claim, TimeoutQueue

logger = logging.getLogger("order_timeout")

# After a Redis or database error: wait this long, doubling up to the cap.
ERROR_BACKOFF_FIRST = 0.5
ERROR_BACKOFF_MAX = 30.0


@dataclass
class ConsumerStats:
    batches: int = 0
    claimed: int = 0
    closed: int = 0
    settled: int = 0
    rescheduled: int = 0
    failed: int = 0
    dropped: int = 0
    errors: int = 0

    def add(self, outcome: CloseOutcome, dropped: int) -> None:
        self.batches += 1
        self.closed += len(outcome.closed)
        self.settled += len(outcome.settled)
        self.rescheduled += len(outcome.not_due)
        self.failed += len(outcome.failed)
        self.dropped += dropped + len(outcome.missing)


class Consumer:
    """Claim -> close -> ack, until asked to stop.

    ``now`` is the clock (a callable returning an aware datetime); one reading
    of it judges a whole batch, in Redis and in the database alike. Tests pass
    their own to step through time without sleeping.
    """

    def __init__(
        self,
        queue: TimeoutQueue | None = None,
        model: type[AbstractTimeoutOrder] | None = None,
        *,
        batch_size: int | None = None,
        max_wait: float | None = None,
        lease_seconds: float | None = None,
        now: Callable[[], datetime] | None = None,
    ) -> None:
        self.queue = queue or TimeoutQueue.from_settings()
        self.model = model or get_order_model()
        self.batch_size = batch_size if batch_size is not None else settings.BATCH_SIZE
        self.max_wait = max_wait if max_wait is not None else settings.MAX_WAIT
        self.lease_ms = round(1000 * (lease_seconds if lease_seconds is not None else settings.LEASE_SECONDS))
        self.now = now or timezone.now
        self.stats = ConsumerStats()
        self._stop = threading.Event()

    # -- stopping -------------------------------------------------------

    def request_stop(self) -> None:
        """Finish the batch in hand, then leave ``run()``. Safe from a signal handler."""
        self._stop.set()

    @property
    def stopping(self) -> bool:
        return self._stop.is_set()

    # -- one batch ------------------------------------------------------

    def claim(self, now: datetime) -> Claim:
        return self.queue.claim(now_score(now), self.batch_size, self.lease_ms)

    def process(self, members: list[str], now: datetime) -> CloseOutcome:
        """Close what is due among claimed ``members``; ack, reschedule or keep each."""
        by_pk: dict[Any, str] = {}
        malformed: list[str] = []
        for member in members:
            try:
                by_pk[parse_member(self.model, member)] = member
            except ValueError:
                malformed.append(member)
        if malformed:
            logger.error("Dropping %d malformed member(s) from the timeout queue: %r",
                         len(malformed), malformed[:20])

        outcome = close_expired(self.model, list(by_pk), now)

        if outcome.missing:
            logger.warning("No %s row for member(s) %r; dropped.", self.model.__name__,
                           [by_pk[pk] for pk in outcome.missing][:20])
        done = [*outcome.closed, *outcome.settled, *outcome.missing]
        self.queue.ack([*malformed, *(by_pk[pk] for pk in done)])
        # Failed members stay leased: another try comes when the lease runs out.
        self.queue.reschedule(
            {by_pk[pk]: deadline_score(deadline) for pk, deadline in outcome.not_due.items()}
        )
        self.stats.add(outcome, dropped=len(malformed))
        return outcome

    def run_once(self) -> Claim:
        """Claim and process one batch; returns the claim (empty when nothing was due)."""
        close_old_connections()
        try:
            now = self.now()
            claim = self.claim(now)
            if claim.members:
                self.stats.claimed += len(claim.members)
                self.process(claim.members, now)
            return claim
        finally:
            close_old_connections()

    # -- the loop -------------------------------------------------------

    def run(self, once: bool = False) -> ConsumerStats:
        """Loop until stopped; with ``once``, until nothing is due, then return.

        Redis and database errors are logged and retried with backoff; in
        ``once`` mode they are raised, since the caller wants a verdict.
        """
        backoff = ERROR_BACKOFF_FIRST
        while not self.stopping:
            try:
                claim = self.run_once()
            except (QueueUnavailable, DatabaseError):
                if once:
                    raise
                self.stats.errors += 1
                logger.exception("Timeout consumer batch failed; retrying in %.1fs.", backoff)
                self._stop.wait(backoff)
                backoff = min(backoff * 2, ERROR_BACKOFF_MAX)
                continue
            backoff = ERROR_BACKOFF_FIRST
            if claim.members:
                continue
            if once:
                break
            self._stop.wait(self._idle_wait(claim.next_score))
        return self.stats

    def _idle_wait(self, next_score: int | None) -> float:
        """Seconds to sleep: until the next deadline in Redis, at most ``max_wait``."""
        if next_score is None:
            return self.max_wait
        wait = (next_score - now_score(self.now())) / 1000
        return min(max(wait, 0.0), self.max_wait)
