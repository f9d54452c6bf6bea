"""The consumer loop: claim due members, close their orders, ack; sleep until the next deadline.

Any number of consumers may run on any hosts: the claim script hands each
member to one of them, and the row lock in ``closing`` decides the rest. A
consumer that dies mid-batch loses nothing: its members stay leased and are
handed to another consumer once the lease runs out.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from datetime import datetime
from typing import Any

from django.db import Error as DatabaseError
from django.db import close_old_connections
from django.utils import timezone

from . import deadletters, get_order_model
from .closing import close_expired
from .codec import deadline_score, now_score, parse_member
from .conf import MAX_BATCH_SIZE, settings
from .deadletters import Failure
from .exceptions import QueueUnavailable
from .models import TimeoutOrderMixin
from .queue import Claim, TimeoutQueue, WakeListener

logger = logging.getLogger("order_timeout")

# After a Redis or database error: wait this long, doubling up to the cap.
ERROR_BACKOFF_FIRST = 0.5
ERROR_BACKOFF_MAX = 30.0
# An order whose row another transaction holds is claimed again this much later.
BUSY_RETRY_MS = 1000


@dataclass
class BatchReport:
    """What one batch did; logged as one line, added up in ConsumerStats."""

    claimed: int = 0
    closed: int = 0
    skipped_paid: int = 0  # paid, or closed before
    rescheduled: int = 0
    failed: int = 0
    dead_lettered: int = 0
    dropped: int = 0


@dataclass
class ConsumerStats(BatchReport):
    """Totals since the consumer started, plus batches and errors survived."""

    batches: int = 0
    errors: int = 0

    def add(self, report: BatchReport) -> None:
        self.batches += 1
        for name in BatchReport.__dataclass_fields__:
            setattr(self, name, getattr(self, name) + getattr(report, name))


class Consumer:
    """Claim -> close -> ack, until asked to stop.

    ``now`` is the clock (a callable returning an aware datetime); one reading
    of it judges a whole batch, in Redis and in the database alike. Tests pass
    their own to step through time without sleeping.
    """

    def __init__(
        self,
        queue: TimeoutQueue | None = None,
        model: type[TimeoutOrderMixin] | None = None,
        *,
        batch_size: int | None = None,
        max_wait: float | None = None,
        lease_seconds: float | None = None,
        now: Callable[[], datetime] | None = None,
    ) -> None:
        self.queue = queue or TimeoutQueue.from_settings()
        self.model = model or get_order_model()
        self.batch_size = batch_size if batch_size is not None else settings.BATCH_SIZE
        if not 1 <= self.batch_size <= MAX_BATCH_SIZE:
            raise ValueError(f"batch_size must be from 1 to {MAX_BATCH_SIZE}, got {self.batch_size}")
        self.max_wait = max_wait if max_wait is not None else settings.MAX_WAIT
        self.lease_ms = round(1000 * (lease_seconds if lease_seconds is not None else settings.LEASE_SECONDS))
        self.retry_delays_ms = [round(1000 * delay) for delay in settings.RETRY_DELAYS]
        self.now = now or timezone.now
        self.stats = ConsumerStats()
        self._stop = threading.Event()
        # Set to end a sleep early: by a stop, or by a new earliest deadline.
        self._wake = threading.Event()
        self._listener: WakeListener | None = None

    # -- stopping -------------------------------------------------------

    def request_stop(self) -> None:
        """Finish the batch in hand, then leave ``run()``."""
        self._stop.set()
        self._wake.set()

    @property
    def stopping(self) -> bool:
        return self._stop.is_set()

    # -- one batch ------------------------------------------------------

    def claim(self, now: datetime, due_by: datetime | None = None) -> Claim:
        """Lease the next batch due by ``due_by`` (default ``now``)."""
        due_ms = now_score(min(now, due_by) if due_by else now)
        return self.queue.claim(due_ms, self.batch_size, now_score(now) + self.lease_ms)

    def process(self, members: list[str], now: datetime) -> BatchReport:
        """Close what is due among claimed ``members``; ack, reschedule or retry each."""
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
        busy_until = now_score(now) + BUSY_RETRY_MS
        self.queue.reschedule({
            **{by_pk[pk]: deadline_score(deadline) for pk, deadline in outcome.not_due.items()},
            # Locked by someone else: look again shortly, not counted as a failure.
            **{by_pk[pk]: busy_until for pk in outcome.busy},
        })
        dead = self._retry_or_bury(outcome.failed, by_pk, now)
        return BatchReport(
            claimed=len(members), closed=len(outcome.closed), skipped_paid=len(outcome.settled),
            rescheduled=len(outcome.not_due) + len(outcome.busy), failed=len(outcome.failed),
            dead_lettered=dead,
            dropped=len(malformed) + len(outcome.missing),
        )

    def _retry_or_bury(self, failed: dict[Any, BaseException], by_pk: dict[Any, str],
                       now: datetime) -> int:
        """Back off each failed order; past the last delay, write its dead letter and let go."""
        if not failed:
            return 0
        pk_of = {member: pk for pk, member in by_pk.items()}
        retries = self.queue.retry([by_pk[pk] for pk in failed], now_score(now), self.retry_delays_ms)
        dead: list[Failure] = []
        for retry in retries:
            pk = pk_of[retry.member]
            error = failed[pk]
            if retry.retry_at_ms is None:
                dead.append(Failure(pk, retry.attempts, retry.first_failure_ms, error))
            logger.warning(
                "close failed order=%s attempt=%d error=%s: %s next=%s",
                retry.member, retry.attempts, type(error).__name__, error,
                "dead-letter" if retry.retry_at_ms is None
                else f"retry in {(retry.retry_at_ms - now_score(now)) / 1000:g}s",
                exc_info=error,
                extra={"order_id": retry.member, "attempt": retry.attempts},
            )
        if dead:
            # Written before the members leave Redis: if this fails, they stay
            # leased and come back after the lease, to be buried again.
            deadletters.record(self.model, dead, now)
            self.queue.ack([by_pk[failure.pk] for failure in dead])
        return len(dead)

    def run_once(self, due_by: datetime | None = None) -> Claim:
        """Claim and process one batch; returns the claim (empty when nothing was due)."""
        close_old_connections()
        try:
            started = time.perf_counter()
            now = self.now()
            claim = self.claim(now, due_by)
            if claim.members:
                report = self.process(claim.members, now)
                self.stats.add(report)
                self._log_batch(report, started)
            return claim
        finally:
            close_old_connections()

    @staticmethod
    def _log_batch(report: BatchReport, started: float) -> None:
        fields = {**asdict(report), "elapsed_ms": round((time.perf_counter() - started) * 1000, 1)}
        logger.info("batch " + " ".join(f"{name}=%s" for name in fields), *fields.values(),
                    extra={"batch": fields})

    # -- the loop -------------------------------------------------------

    def run(self, once: bool = False) -> ConsumerStats:
        """Loop until stopped; with ``once``, until nothing is due, then return.

        Redis and database errors are logged and retried with backoff; in
        ``once`` mode they are raised, since the caller wants a verdict.
        """
        if once:
            return self._run(once=True)
        try:
            return self._run(once=False)
        finally:
            if self._listener is not None:
                self._listener.close()
                self._listener = None

    def _run(self, once: bool) -> ConsumerStats:
        backoff = ERROR_BACKOFF_FIRST
        # --once means "what is due now": a fixed cutoff, so a steady stream
        # of new deadlines cannot keep it running.
        due_by = self.now() if once else None
        while not self.stopping:
            try:
                claim = self.run_once(due_by)
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
            self._sleep(self._idle_wait(claim.next_score))
        return self.stats

    def _sleep(self, seconds: float) -> None:
        """Sleep until ``seconds`` pass, a new earliest deadline is scheduled, or a stop."""
        if self._listener is None:
            try:
                self._listener = self.queue.listen_for_wakeups(self._wake.set)
            except QueueUnavailable:
                logger.warning("No wake-up subscription; new early deadlines wait up to MAX_WAIT.",
                               exc_info=True)
        self._wake.wait(seconds)
        if not self.stopping:
            self._wake.clear()

    def _idle_wait(self, next_score: int | None) -> float:
        """Seconds to sleep: until the next deadline in Redis, at most ``max_wait``."""
        if next_score is None:
            return self.max_wait
        wait = (next_score - now_score(self.now())) / 1000
        return min(max(wait, 0.0), self.max_wait)
