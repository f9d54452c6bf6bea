"""The consumer loop: claim due members, close their orders, ack; sleep until the next deadline.

Any number of consumers may run on any hosts: the claim script hands each
member to one of them, and the row lock in ``closing`` decides the rest. A
consumer that dies mid-batch loses nothing: its members stay leased and are
taken over, one at a time, once the lease runs out; one taken over too often
becomes a dead letter, so no order can stall the others.
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from datetime import datetime, timedelta
from typing import Any

from django.db import Error as DatabaseError, close_old_connections, connections, router
from django.utils import timezone

from . import deadletters, get_order_model
from .closing import close_expired
from .codec import deadline_score, now_score, parse_member
from .conf import MAX_BATCH_SIZE, settings
from .dbsession import database_now, limit_session, session_id
from .deadletters import Failure
from .exceptions import QueueUnavailable, RepeatedTakeover
from .keys import REMIND
from .leaseguard import LeaseGuard, WatchedBatch
from .metrics import ConsumerMetrics
from .models import TimeoutOrderMixin
from .queue import BUSY, HELD, Claim, Lanes, TimeoutQueue
from .reminders import ReminderProcessor, ReminderReport
from .rota import ShardRota
from .rowlock import validate_hold_condition
from .stuck import exit_stuck
from .wakeups import WakeListener

logger = logging.getLogger("order_timeout")

# After a Redis or database error: wait this long, doubling up to the cap.
ERROR_BACKOFF_FIRST = 0.5
ERROR_BACKOFF_MAX = 30.0
# An order whose row another transaction holds is claimed again this much later.
BUSY_RETRY_MS = 1000
# The database-minus-host clock offset is the largest of this many recent readings.
CLOCK_SAMPLES = 20


@dataclass
class BatchReport:
    """What one batch did; logged as one line, added up in ConsumerStats."""

    claimed: int = 0
    closed: int = 0
    # Settled when looked at: paid, or closed before (by another consumer, the scan, staff).
    skipped_paid: int = 0
    rescheduled: int = 0
    failed: int = 0
    dead_lettered: int = 0
    dropped: int = 0
    abandoned: int = 0  # given up after LEASE_SECONDS, handed to the next claim
    held: int = 0  # due, but a payment in flight holds them (HOLD_CONDITION)


@dataclass
class ConsumerStats(BatchReport):
    """Totals since the consumer started, plus batches and errors survived, and the reminders."""

    batches: int = 0
    errors: int = 0
    reminders: ReminderReport = field(default_factory=ReminderReport)

    def add(self, report: BatchReport | ReminderReport) -> None:
        self.batches += 1
        totals: Any = self.reminders if isinstance(report, ReminderReport) else self
        for name in type(report).__dataclass_fields__:
            setattr(totals, name, getattr(totals, name) + getattr(report, name))


class Consumer:
    """Claim -> close -> ack, until asked to stop.

    ``now`` is this host's clock (a callable returning an aware datetime).
    The database decides whether an order is due; the consumer learns how far
    its clock is from the database's with every batch, and claims by the
    database's time (erring late), so a host whose clock runs fast does not
    claim early. Tests that step time by hand pass their own ``now`` and
    ``follow_database_clock=False``.

    ``exit_when_stuck`` is for a process that is only a consumer
    (``run_timeout_consumer``): when a receiver stays stuck after its batch
    was given up, the process exits with ``stuck.EXIT_STUCK`` for its supervisor to
    restart, rather than live on closing nothing.
    """

    def __init__(
        self,
        queue: TimeoutQueue | None = None,
        model: type[TimeoutOrderMixin] | None = None,
        *,
        batch_size: int | None = None,
        max_wait: float | None = None,
        batch_window: float | None = None,
        lease_seconds: float | None = None,
        now: Callable[[], datetime] | None = None,
        follow_database_clock: bool = True,
        metrics: ConsumerMetrics | None = None,
        exit_when_stuck: bool = False,
    ) -> None:
        self.model = model or get_order_model()
        # A setting mistake must stop the consumer here, never fail the orders it claims.
        validate_hold_condition(self.model)
        self.queue = queue or TimeoutQueue.from_settings()
        self.batch_size = batch_size if batch_size is not None else settings.BATCH_SIZE
        if not 1 <= self.batch_size <= MAX_BATCH_SIZE:
            raise ValueError(f"batch_size must be from 1 to {MAX_BATCH_SIZE}, got {self.batch_size}")
        self.max_wait = max_wait if max_wait is not None else settings.MAX_WAIT
        self.batch_window = batch_window if batch_window is not None else settings.BATCH_WINDOW
        self.lease_seconds = lease_seconds if lease_seconds is not None else settings.LEASE_SECONDS
        self.lease_ms = round(1000 * self.lease_seconds)
        self.retry_delays_ms = [round(1000 * delay) for delay in settings.RETRY_DELAYS]
        self.max_takeovers = settings.MAX_TAKEOVERS
        self.hold_recheck_ms = round(1000 * settings.HOLD_RECHECK)
        self.now = now or timezone.now
        # Off only for tests that step time by hand through ``now``.
        self.follow_database_clock = follow_database_clock
        self.exit_when_stuck = exit_when_stuck
        self.stats = ConsumerStats()
        # Counted only where someone reads them (run_timeout_consumer --metrics-port).
        self.metrics = metrics or ConsumerMetrics(enabled=False)
        self.using = router.db_for_write(self.model)
        # Database clock minus this host's, from recent batches (each reading errs low).
        self._clock_readings: deque[timedelta] = deque(maxlen=CLOCK_SAMPLES)
        self._claims = (f"{uuid.uuid4().hex[:12]}:{n}" for n in itertools.count())
        self._stop = threading.Event()
        # Set to end a sleep early: by a stop, or by a new earliest deadline.
        self._wake = threading.Event()
        self._listener: WakeListener | None = None
        # The reminders' queue, when ORDER_TIMEOUT["REMINDERS"] asks for any: its shards are
        # lanes after the closes', claimed in turn with them.
        self.reminder_queue = self.queue.of_kind(REMIND) if settings.REMINDERS else None
        self.lanes = Lanes([self.queue, *([self.reminder_queue] if self.reminder_queue else [])])
        self.reminders = (ReminderProcessor(self.reminder_queue, self.model,
                                            retry_delays_ms=self.retry_delays_ms,
                                            max_takeovers=self.max_takeovers, metrics=self.metrics)
                          if self.reminder_queue else None)
        self.rota = ShardRota(len(self.lanes.shards))
        self._refreshed_at = time.monotonic()
        self._guard: LeaseGuard | None = None
        self._limited_connection: Any = None
        # The last claim took a member over: the next lets due members go first.
        self._took_over = False

    # -- the clock ------------------------------------------------------

    @property
    def clock_offset(self) -> timedelta:
        return max(self._clock_readings, default=timedelta(0))

    def clock(self) -> datetime:
        """This host's time, corrected to the database's.

        Each reading errs low, so the corrected clock is not ahead of the
        database's, except after this host's clock steps forward: until the
        readings taken before the step age out (``CLOCK_SAMPLES`` batches) it
        runs ahead by the step. The database still decides whether an order
        is due, so that costs a look at orders not due yet, never an early close.
        """
        return self.now() + self.clock_offset

    def _learn_clock(self, db_now: datetime | None) -> None:
        if db_now is not None and self.follow_database_clock:
            # Read after the statement returned: the reading is the true offset minus that delay.
            self._clock_readings.append(db_now - self.now())

    def sync_clock(self) -> None:
        """Read the database's clock once (at start, before the first claim)."""
        self._learn_clock(database_now(self.using))

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
        """Lease the next batch due by ``due_by`` (default ``now``), from the next lane due."""
        due_ms = now_score(min(now, due_by) if due_by else now)
        lane = self.rota.next_due(due_ms)
        if lane is None:
            return Claim(members=[], next_score=self.rota.earliest())
        claim = self.lanes.shards[lane].claim(due_ms, self.batch_size, now_score(now) + self.lease_ms,
                                              next(self._claims), due_first=self._took_over)
        self._took_over = claim.takeovers > 0
        self.rota.claimed(lane, claim)
        return claim

    def queue_of(self, claim: Claim) -> TimeoutQueue:
        """The queue a claim came from: the closes', or the reminders'."""
        return self.reminder_queue if claim.kind == REMIND and self.reminder_queue else self.queue

    def process(self, claim: Claim, now: datetime) -> BatchReport | ReminderReport:
        """Act on what is due among the claimed members (a close, or a reminder); ack, reschedule
        or retry each."""
        if claim.kind == REMIND:
            assert self.reminders is not None
            return self.reminders.process(claim, now, self._watching, self._learn_clock, self.clock)
        return self._close(claim, now)

    def _close(self, claim: Claim, now: datetime) -> BatchReport:
        """Close what is due among the claimed members; ack, reschedule or retry each."""
        if claim.takeovers > self.max_takeovers:
            return self._bury_taken_over(claim, now)
        by_pk: dict[Any, str] = {}
        malformed: list[str] = []
        for member in claim.members:
            try:
                by_pk[parse_member(self.model, member)] = member
            except ValueError:
                malformed.append(member)
        if malformed:
            logger.error("Dropping %d malformed member(s) from the timeout queue into its quarantine: %r",
                         len(malformed), malformed[:20])
            self.queue.quarantine(claim.token, malformed, now_score(now))

        with self._watching(claim) as batch:
            outcome = close_expired(self.model, list(by_pk),
                                    should_stop=batch.expired if batch else None)
        self._learn_clock(outcome.db_now)
        closed_at = self.clock()

        if outcome.missing:
            logger.warning("No %s row for member(s) %r; dropped.", self.model.__name__,
                           [by_pk[pk] for pk in outcome.missing][:20])
        done = [*outcome.closed, *outcome.settled, *outcome.missing]
        self.queue.ack(claim.token, [by_pk[pk] for pk in done])
        self.queue.reschedule(claim.token, {
            by_pk[pk]: deadline_score(deadline) for pk, deadline in outcome.not_due.items()})
        # Locked by someone else: look again shortly, not counted as a failure.
        self.queue.reschedule(claim.token, {by_pk[pk]: now_score(now) + BUSY_RETRY_MS
                                            for pk in outcome.busy}, mark=BUSY, since_ms=now_score(now))
        # A payment in flight: look again every HOLD_RECHECK, and no later than MAX_HOLD allows.
        self.queue.reschedule(claim.token, {by_pk[pk]: self._recheck_ms(deadline, now)
                                            for pk, deadline in outcome.held.items()},
                              mark=HELD, since_ms=now_score(now))
        if outcome.abandoned:
            # Hand them to the next claim at once, each alone (the guard did, unless it was not there).
            self.queue.hand_over(claim.token, [by_pk[pk] for pk in outcome.abandoned],
                                 now_score(self.clock()))
        dead = self._retry_or_bury(claim.token, outcome.failed, by_pk, now)
        self.metrics.batch(
            {"closed": len(outcome.closed), "settled": len(outcome.settled),
             "rescheduled": len(outcome.not_due), "busy": len(outcome.busy), "held": len(outcome.held),
             "failed": len(outcome.failed), "dead_lettered": dead,
             "dropped": len(malformed) + len(outcome.missing), "abandoned": len(outcome.abandoned)},
            (self.clock() - now).total_seconds(),
            ((closed_at - deadline).total_seconds() for deadline in outcome.deadlines.values()))
        return BatchReport(
            claimed=len(claim.members), closed=len(outcome.closed),
            skipped_paid=len(outcome.settled),
            rescheduled=len(outcome.not_due) + len(outcome.busy), held=len(outcome.held),
            failed=len(outcome.failed),
            dead_lettered=dead, dropped=len(malformed) + len(outcome.missing),
            abandoned=len(outcome.abandoned),
        )

    @contextmanager
    def _watching(self, claim: Claim) -> Iterator[WatchedBatch | None]:
        """Limit this batch's database session, and let the guard watch it (under ``run()``)."""
        connection = connections[self.using]
        connection.ensure_connection()
        if connection.connection is not self._limited_connection:
            limit_session(connection, self.lease_seconds)
            self._limited_connection = connection.connection
        if self._guard is None:
            yield None
            return
        batch: WatchedBatch | None = None
        try:
            with self._guard.watching(claim.token, claim.members, session_id(connection), self.using,
                                      queue=self.queue_of(claim)) as batch:
                yield batch
        finally:
            # The guard let go of it above: given_up is final. A session given up is being
            # ended (by the guard; behind a transaction pooler, by the server's limits):
            # what follows (dead letters, the next batch) needs a new one.
            if batch is not None and batch.given_up.is_set():
                connection.close()

    def _recheck_ms(self, deadline: datetime, now: datetime) -> int:
        """When to look at a held order again: HOLD_RECHECK from now, not past its MAX_HOLD."""
        recheck = now_score(now) + self.hold_recheck_ms
        if settings.MAX_HOLD is None:
            return recheck
        return min(recheck, deadline_score(deadline + timedelta(seconds=settings.MAX_HOLD)))

    def _bury_taken_over(self, claim: Claim, now: datetime) -> BatchReport:
        """A member whose consumers kept dying with it: a dead letter, not another try.

        Unless its row is settled already (``deadletters.record`` looks under
        the row lock): a holder that overran its lease may still have
        committed the close (or the shop took the payment), and a dead letter
        would send staff after an order that needs nobody.
        """
        member = claim.members[0]
        try:
            pk = parse_member(self.model, member)
        except ValueError:
            logger.error("Dropping a malformed member from the timeout queue into its quarantine: %r", member)
            self.queue.quarantine(claim.token, [member], now_score(now))
            return BatchReport(claimed=1, dropped=1)
        error = RepeatedTakeover(
            f"Its consumer died, froze or overran LEASE_SECONDS with it {claim.takeovers} times "
            "(a receiver that exits the process, runs out of memory or hangs?); not tried again.")
        burial = self._record_dead_letters(
            claim.token, [Failure(pk, claim.takeovers, now_score(now), error)], {pk: member}, now)
        if burial.buried:
            logger.error("order=%s taken over %d times: dead-lettered without another try.",
                         member, claim.takeovers)
        elif burial.settled or burial.missing:
            logger.info("order=%s taken over %d times, but %s: let go.", member, claim.takeovers,
                        "gone" if burial.missing else "settled already")
        return BatchReport(claimed=1, dead_lettered=len(burial.buried), skipped_paid=len(burial.settled),
                           dropped=len(burial.missing))

    def _retry_or_bury(self, token: str, failed: dict[Any, BaseException], by_pk: dict[Any, str],
                       now: datetime) -> int:
        """Back off each failed order; past the last delay, write its dead letter and let go."""
        if not failed:
            return 0
        pk_of = {member: pk for pk, member in by_pk.items()}
        retries = self.queue.retry(token, [by_pk[pk] for pk in failed], now_score(now),
                                   self.retry_delays_ms)
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
        return len(self._record_dead_letters(token, dead, by_pk, now).buried) if dead else 0

    def _record_dead_letters(self, token: str, dead: list[Failure], by_pk: dict[Any, str],
                             now: datetime) -> deadletters.Burial:
        """Write the dead letters of the orders still unpaid, then let every member go.

        Written before the members leave Redis. If the write fails, they go
        back on the queue a last retry delay later, to be buried then: at
        most one try per that delay, never a loop, nothing lost.
        """
        members = [by_pk[failure.pk] for failure in dead]
        try:
            burial = deadletters.record(self.model, dead, now)
        except DatabaseError as exc:
            wait_ms = max(self.retry_delays_ms, default=self.lease_ms)
            logger.error("Could not write %d dead letter(s) (%s: %s); order(s) %s go back on the "
                         "queue and are buried %gs later.", len(dead), type(exc).__name__, exc,
                         ", ".join(members[:20]), wait_ms / 1000)
            self.queue.reschedule(token, {member: now_score(now) + wait_ms for member in members})
            return deadletters.Burial()
        if burial.settled:
            logger.info("order(s) %s settled before their dead letter was written: let go.",
                        ", ".join(by_pk[pk] for pk in burial.settled[:20]))
        self.queue.ack(token, members)
        return burial

    def run_once(self, due_by: datetime | None = None) -> Claim:
        """Claim and process one batch; returns the claim (empty when nothing was due)."""
        close_old_connections()
        try:
            started = time.perf_counter()
            now = self.clock()
            claimed = time.perf_counter()
            claim = self.claim(now, due_by)
            self.metrics.claimed(time.perf_counter() - claimed, len(claim.members))
            if claim.members:
                try:
                    report = self.process(claim, now)
                except DatabaseError:
                    self._release(claim, now)
                    raise
                self.stats.add(report)
                if isinstance(report, ReminderReport):
                    report.log()
                else:
                    self._log_batch(report, started)
            return claim
        finally:
            close_old_connections()

    def _release(self, claim: Claim, now: datetime) -> None:
        """The database failed us, not the orders: put them back, due, without counting a takeover."""
        try:
            self.queue_of(claim).reschedule(claim.token, {member: now_score(now) for member in claim.members})
        except QueueUnavailable:
            logger.warning("Could not put back %d claimed member(s); they are taken over when "
                           "their lease runs out.", len(claim.members))

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
        self._guard = LeaseGuard(self.queue, self.lease_seconds, lambda: now_score(self.clock()),
                                 on_stuck=self._exit_stuck if self.exit_when_stuck else None)
        try:
            if self.follow_database_clock:
                try:
                    self.sync_clock()
                except DatabaseError as exc:
                    if once:
                        raise
                    logger.warning("Could not read the database's clock yet (%s); going on.", exc)
            return self._run(once=once)
        finally:
            self._guard.close()
            self._guard = None
            if self._listener is not None:
                self._listener.close()
                self._listener = None

    @staticmethod
    def _exit_stuck(batch: WatchedBatch) -> None:
        """Leave the process now: the stuck thread cannot be freed, its leases are handed over."""
        exit_stuck()

    def _run(self, once: bool) -> ConsumerStats:
        backoff = ERROR_BACKOFF_FIRST
        # --once means "what is due now": a fixed cutoff, so a steady stream
        # of new deadlines cannot keep it running.
        due_by = self.clock() if once else None
        while not self.stopping:
            try:
                claim = self.run_once(due_by)
            except (QueueUnavailable, DatabaseError) as exc:
                if once:
                    raise
                self.stats.errors += 1
                self.metrics.error("redis" if isinstance(exc, QueueUnavailable) else "database")
                # An outage is expected: one line with its cause per backoff step, no traceback.
                logger.warning("Timeout consumer batch failed (%s: %s); retrying in %.1fs.",
                               type(exc).__name__, exc, backoff)
                self._stop.wait(backoff)
                backoff = min(backoff * 2, ERROR_BACKOFF_MAX)
                continue
            backoff = ERROR_BACKOFF_FIRST
            if claim.members:
                continue
            if once:
                assert due_by is not None
                if not self.rota.has_due(now_score(due_by)):
                    break
                continue
            if self.rota.has_due(now_score(self.clock())) or self._refresh_due():
                continue
            self._sleep(self._idle_wait(self.rota.earliest()))
        return self.stats

    def _refresh_due(self) -> bool:
        """Every MAX_WAIT, learn every shard's next score (one round trip): a lost wake-up heals."""
        if time.monotonic() - self._refreshed_at < self.max_wait:
            return False
        self._refreshed_at = time.monotonic()
        try:
            self.rota.refreshed(self.lanes.next_scores())
        except QueueUnavailable:
            return False
        return self.rota.has_due(now_score(self.clock()))

    def _woken(self, shard: int) -> None:
        self.rota.woke(shard)
        self._wake.set()

    def _sleep(self, seconds: float) -> None:
        """Sleep until ``seconds`` pass, a new earliest deadline is scheduled, or a stop."""
        if self._listener is None:
            self._listener = WakeListener(self.lanes, self._woken)
        self._wake.wait(seconds)
        if not self.stopping:
            self._wake.clear()

    def _idle_wait(self, next_score: int | None) -> float:
        """Seconds to sleep: until the next deadline in Redis and the batch window, at most ``max_wait``."""
        if next_score is None:
            return self.max_wait
        wait = (next_score - now_score(self.clock())) / 1000 + self.batch_window
        return min(max(wait, 0.0), self.max_wait)

