"""The consumer loop: claim what is due, hand it to the lifecycle, sleep until the next deadline.

Any number of consumers may run on any hosts: the claim script hands each
member to one of them, and the row lock the lifecycle takes decides the
rest. A consumer serves every kind of timer (the order close, the reminders,
each timer a shop declared): each kind's shards are lanes, claimed in turn,
so no kind waits behind another. A consumer that dies mid-batch loses
nothing: its members stay leased and are taken over as a batch once its
heartbeat (or lease) runs out, then member by member if they die again; one
that died alone with its holders too often is given up, so no row can stall
the others.
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from django.core.exceptions import ImproperlyConfigured
from django.db import DEFAULT_DB_ALIAS, Error as DatabaseError, close_old_connections, router
from django.utils import timezone

from .checks import close_field_messages
from .collector import FullCollections
from .conf import MAX_BATCH_SIZE, settings
from .db import datetimes
from .db.locks import validate_conditions
from .db.schema import named, unapplied_migrations
from .exceptions import QueueUnavailable
from .models import DeadLetter, TimeoutOrderMixin
from .queue import HELD, SLICE, Claim, Lanes, TimeoutQueue
from .queue.lanes import ShardRota
from .queue.shards import Shard
from .queue.wakeups import WakeListener
from .redaction import one_line
from .reporting.metrics import ConsumerMetrics
from .scans.housekeeper import Housekeeper
from .scans.recovery import QueueRecovery
from .timers.clock import DatabaseClock
from .timers.heartbeats import Heartbeat
from .timers.kind import Kind
from .timers.leases import LeaseGuard, WatchedBatch
from .timers.lifecycle import Lifecycle
from .timers.members import now_score
from .timers.outcome import Report
from .timers.pausing import PauseWatch, synced_flags
from .timers.registry import ORDER_TIMEOUT, REMINDERS, registry
from .timers.sizing import BatchSizes
from .timers.watch import BatchWatch
from .timers.watchdog import exit_stuck

logger = logging.getLogger("order_timeout")

# After a Redis or database error: wait this long, doubling up to the cap.
ERROR_BACKOFF_FIRST = 0.5
ERROR_BACKOFF_MAX = 30.0
# Started before ``manage.py migrate``: ask again this often, and say so again this often.
MIGRATIONS_RECHECK = 1.0
MIGRATIONS_REMINDER = 60.0


class Totals:
    """One kind's figures since the consumer started, by its own names (``stats.closed``,
    ``stats.reminders.sent``)."""

    def __init__(self, kind: Kind) -> None:
        self.kind = kind
        self.report = Report()

    def named(self, report: Report | None = None) -> dict[str, int]:
        """A report in the kind's own words: what its log line and its totals say."""
        report = report or self.report
        labels = self.kind.wording.outcomes
        named = {"claimed": report.claimed, labels.get("acted", "acted"): report.acted,
                 labels.get("settled", "settled"): report.settled}
        if "passed" in labels:
            named[labels["passed"]] = report.passed
        named.update({"rescheduled": report.rescheduled + report.busy, "failed": report.failed,
                      labels.get("given_up", "given_up"): report.given_up, "dropped": report.dropped,
                      "abandoned": report.abandoned})
        if "passed" not in labels:
            named["held"] = report.held
        return named

    def __getattr__(self, name: str) -> int:
        named = self.named()
        if name in named:
            return named[name]
        raise AttributeError(name)


@dataclass
class _Carried:
    """What a committed batch leaves for the next claim of its ``shard``, under its claim's ``token``:
    its done members to ack, its held members to put back (their next looks, found held at
    ``held_since``)."""

    shard: Shard
    token: str
    members: list[str] = field(default_factory=list)
    next_looks: dict[str, int] = field(default_factory=dict)
    held_since: int = 0

    def told(self) -> None:
        """Tell Redis now, each by a call of its own (a sleep, a stop, another shard)."""
        if self.members:
            self.shard.forget(self.token, self.members)
        if self.next_looks:
            self.shard.reschedule(self.token, self.next_looks, HELD, self.held_since)


class _CarriedToNextClaim:
    """The lifecycle's settler for one claim: what fits a claim is kept for the next claim of its
    shard (``Consumer._carried``); more than that is told at once, in slices."""

    def __init__(self, consumer: Consumer, shard: Shard, token: str) -> None:
        self.consumer, self.shard, self.token = consumer, shard, token

    def _carried(self) -> _Carried:
        carried = self.consumer._carried
        if carried is None or carried.token != self.token:
            if carried is not None:
                carried.told()  # another batch's, not carried yet (a claim not made by claim()): now
            carried = self.consumer._carried = _Carried(self.shard, self.token)
        return carried

    def ack(self, token: str, members: list[str]) -> None:
        if len(members) > SLICE:
            self.shard.forget(token, members)
        else:
            self._carried().members = members

    def hold(self, token: str, next_looks: dict[str, int], since_ms: int) -> None:
        if len(next_looks) > SLICE:
            self.shard.reschedule(token, next_looks, HELD, since_ms)
        else:
            carried = self._carried()
            carried.next_looks, carried.held_since = next_looks, since_ms


@dataclass
class ConsumerStats:
    """Totals since the consumer started, per kind, plus batches and errors survived.

    The order close's figures read directly (``stats.closed``, ``stats.dead_lettered``), the
    reminders' as ``stats.reminders.sent``, a declared timer's as ``stats.of("name").acted``.
    """

    batches: int = 0
    errors: int = 0
    kinds: dict[str, Totals] = field(default_factory=dict)

    def of(self, name: str) -> Totals:
        if name not in self.kinds:
            self.kinds[name] = Totals(registry.get(name))
        return self.kinds[name]

    def add(self, kind: Kind, report: Report) -> None:
        self.batches += 1
        self.of(kind.name).report.add(report)

    @property
    def reminders(self) -> Totals:
        return self.of(REMINDERS.name)

    def __getattr__(self, name: str) -> int:
        if name.startswith("_") or name in ("kinds", "batches", "errors"):
            raise AttributeError(name)
        return getattr(self.of(ORDER_TIMEOUT.name), name)


class Consumer:
    """Claim -> lifecycle -> sleep, until asked to stop.

    ``now`` is this host's clock (a callable returning an aware datetime).
    The database decides whether a row is due; the consumer learns how far
    its clock is from the database's with every batch, and claims by the
    database's time (erring late). Tests that step time by hand pass their
    own ``now`` and ``follow_database_clock=False``.

    ``exit_when_stuck`` is for a process that is only a consumer
    (``run_timeout_consumer``): when a receiver stays stuck after its batch
    was given up, the process exits with ``stuck.EXIT_STUCK`` for its
    supervisor to restart, rather than live on acting on nothing.
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
        batch_time_limit: float | None = None,
        heartbeat_seconds: float | None = None,
        now: Callable[[], datetime] | None = None,
        follow_database_clock: bool = True,
        metrics: ConsumerMetrics | None = None,
        exit_when_stuck: bool = False,
        kinds: list[Kind] | None = None,
        housekeeping: bool = False,
        collects_between_batches: bool = False,
    ) -> None:
        # The order close (and its reminders) of ``model`` when it is not ORDER_MODEL.
        self.kinds = registry.kinds_for(model, kinds)
        # None: no order close (ORDER_MODEL is None), only declared timers.
        self.model = model or (ORDER_TIMEOUT.model if settings.closes_orders() else None)
        # A setting (or declaration) mistake must stop the consumer here, never fail the rows it claims.
        if self.model is not None:
            validate_conditions(self.model)
            for problem in close_field_messages(self.model)[:1]:
                raise ImproperlyConfigured(f"{problem.msg} {problem.hint}")
        for kind in self.kinds:
            kind.validate()
        # Every locked row's DATETIME columns, decoded in C (the same values).
        datetimes.install()
        self.queue = queue or TimeoutQueue.from_settings()
        self.batch_size = batch_size if batch_size is not None else settings.BATCH_SIZE
        if not 1 <= self.batch_size <= MAX_BATCH_SIZE:
            raise ValueError(f"batch_size must be from 1 to {MAX_BATCH_SIZE}, got {self.batch_size}")
        self.max_wait = max_wait if max_wait is not None else settings.MAX_WAIT
        self.batch_window = batch_window if batch_window is not None else settings.BATCH_WINDOW
        self.lease_seconds = lease_seconds if lease_seconds is not None else settings.LEASE_SECONDS
        self.lease_ms = round(1000 * self.lease_seconds)
        # A lease given here (a test's short one) is the limit too, unless a limit is given.
        self.batch_time_limit = (batch_time_limit if batch_time_limit is not None
                                 else settings.BATCH_TIME_LIMIT if settings.BATCH_TIME_LIMIT is not None
                                 else self.lease_seconds)
        self.heartbeat_seconds = (heartbeat_seconds if heartbeat_seconds is not None
                                  else settings.HEARTBEAT_SECONDS)
        self.exit_when_stuck = exit_when_stuck
        # Take part in the fleet's scan and prune (scans/housekeeper.py): run_timeout_consumer's
        # default; off for a consumer made in code (a test's, a shop's own loop) unless asked.
        self.housekeeping = housekeeping
        self.stats = ConsumerStats()
        # Counted only where someone reads them (run_timeout_consumer --metrics-port).
        self.metrics = metrics or ConsumerMetrics(enabled=False)
        # The database whose clock the consumer follows: the order close's, else its first kind's.
        self.using = (router.db_for_write(self.model) if self.model is not None
                      else self.kinds[0].using if self.kinds else DEFAULT_DB_ALIAS)
        self.clock = DatabaseClock(now, follow_database=follow_database_clock)
        self.watch = BatchWatch(self.batch_time_limit)
        self.lifecycle = Lifecycle(clock=self.clock, watch=self.watch,
                                   retry_delays_ms=[round(1000 * delay) for delay in settings.RETRY_DELAYS],
                                   max_takeovers=settings.MAX_TAKEOVERS, lease_ms=self.lease_ms)
        # Each kind's queue on the same client, prefix and shards; its shards are lanes.
        self.queues = [self.queue if kind.key_space == self.queue.kind else self.queue.of_kind(kind.key_space)
                       for kind in self.kinds]
        self.lanes = Lanes(self.queues)
        self._kind_of_lane = [kind for kind, queue in zip(self.kinds, self.queues, strict=True)
                              for _ in queue.shards]
        # Most members a claim of each lane takes: the batch size, or less for a kind that says so;
        # fewer while that kind's batches overrun BATCH_TIME_LIMIT (timers/sizing.py).
        self.sizes = BatchSizes(most=[min(self.batch_size, kind.claim_limit or self.batch_size)
                                      for kind in self._kind_of_lane],
                                kinds=[kind.label for kind in self._kind_of_lane], time_limit=self.batch_time_limit)
        self._claimed_lane = 0
        self.rota = ShardRota(len(self.lanes.shards),
                              yielding={lane for lane, kind in enumerate(self._kind_of_lane) if kind.yields},
                              gathering={lane: round(1000 * kind.gathers)
                                         for lane, kind in enumerate(self._kind_of_lane) if kind.gathers})
        # This consumer's id: the first part of its claim tokens, and what its heartbeat names.
        self.consumer_id = uuid.uuid4().hex[:12]
        self._claims = (f"{self.consumer_id}:{n}" for n in itertools.count())
        self._stop = threading.Event()
        # Set to end a sleep early: by a stop, or by a new earliest deadline.
        self._wake = threading.Event()
        self._listener: WakeListener | None = None
        self._refreshed_at = time.monotonic()
        # A process that only consumes (the command's): full collections only between batches.
        self.collections = FullCollections() if collects_between_batches else None
        # The last claim took a member over: the next lets due members go first.
        self._took_over = False
        # False in --once: no kind's due members wait to gather.
        self._lets_gather = True
        # The last batch's done members, committed and not acked yet, and its held members, not put
        # back yet: they go with the next claim of their shard, or at once before anything else (a
        # sleep, a stop, another shard).
        self._carried: _Carried | None = None
        # Set by a heartbeat that found a shard without its epoch marker: Redis lost the queue.
        self._epoch_missing = threading.Event()
        self.recovery = QueueRecovery(self.queue, self.queues, self.kinds)
        # The kinds staff paused (the database's pauses, told through Redis at every heartbeat).
        # Each read of the database makes the claims' flags agree with it (a stale one cleared).
        self.pauses = PauseWatch(self.queue.housekeeping, on_change=self._pauses_changed,
                                 every=self.heartbeat_seconds,
                                 read=lambda: synced_flags(self.queue, self.kinds))
        self._pauses_loaded = False

    # -- the clock ------------------------------------------------------

    @property
    def clock_offset(self) -> timedelta:
        return self.clock.offset

    def sync_clock(self) -> None:
        """Read the database's clock once (at start, before the first claim)."""
        self.clock.sync(self.using)

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
        """Lease the next batch due by ``due_by`` (default ``now``), from the next lane due; the
        last batch's ack goes with it when it is of the same shard, else first, on its own."""
        due_ms = now_score(min(now, due_by) if due_by else now)
        lane = self.rota.next_due(due_ms)
        if lane is None:
            self.flush_acks()
            return Claim(members=[], next_score=self.rota.earliest())
        shard = self.lanes.shards[lane]
        carried = self._carried
        if carried is not None and carried.shard is not shard:
            self.flush_acks()
            carried = None
        asked = self.rota.wakes()
        limit = self.sizes.limit(lane)
        claim = shard.claim(due_ms, limit, now_score(now) + self.lease_ms, next(self._claims),
                            due_first=self._took_over,
                            ack=(carried.token, carried.members) if carried is not None else None,
                            held=(carried.held_since, carried.next_looks) if carried and carried.next_looks else None)
        self._carried = None
        self._took_over = claim.takeovers > 0
        self._claimed_lane = lane
        # A gathering kind waits before its next claim (ShardRota), but not in --once: what is due
        # now is claimed now.
        self.rota.claimed(lane, claim, full=len(claim.members) >= limit, since=asked,
                          at=due_ms if self._lets_gather else None)
        return claim

    def kind_of(self, claim: Claim) -> tuple[Kind, TimeoutQueue]:
        """The kind a claim came from, and its queue."""
        for kind, queue in zip(self.kinds, self.queues, strict=True):
            if queue.kind == claim.kind:
                return kind, queue
        raise LookupError(f"a claim of kind {claim.kind!r}, which this consumer does not serve")

    def process(self, claim: Claim, now: datetime) -> Report:
        """The one door into the lifecycle, for ``run()`` and a test's claim alike: act on what is due,
        ack (with the next claim, or ``flush_acks()``), reschedule or retry each; count it, and size
        the next claims by the report's timing."""
        kind, queue = self.kind_of(claim)
        try:
            report = self.lifecycle.process(kind, queue, claim, now,
                                            settler=_CarriedToNextClaim(self, queue.shards[claim.shard], claim.token))
        except DatabaseError:
            self._release(kind, queue, claim, now)
            raise
        if report.timing is not None:
            self.sizes.finished(self._claimed_lane, claimed=len(claim.members), seconds=report.timing.seconds,
                                given_up=report.timing.given_up, done=report.timing.done)
        self.stats.add(kind, report)
        self.metrics.count_report(kind, report)
        return report

    def drain(self, now: Callable[[], datetime]) -> Report:
        """Claim and process every batch due by ``now()`` (asked again before each claim), in this
        thread and on its connection, then ack; the reports added up. What ``run(once=True)`` does
        without its threads (heartbeat, lease guard, wake-ups), session limits or recycled
        connections, so it may run inside the caller's transaction: order_timeout.testing's runner,
        in a test's."""
        self._lets_gather = False
        if not self._pauses_loaded:
            self.pauses.load()
            self._pauses_loaded = True
        total = Report()
        try:
            while True:
                at = now()
                claim = self.claim(at)
                if claim.members:
                    total.add(self.process(claim, at))
                elif not self.rota.has_due(now_score(at)):
                    return total  # every lane asked, none has anything due
        finally:
            self.flush_acks()

    def run_once(self, due_by: datetime | None = None) -> Claim:
        """Claim and process one batch, acked before this returns; returns the claim (empty when
        nothing was due)."""
        try:
            return self._run_once(due_by)
        finally:
            self.flush_acks()

    def flush_acks(self) -> None:
        """Ack the last batch now (and put its held members back), if that is still waiting for a
        claim (a sleep, a stop)."""
        carried, self._carried = self._carried, None
        if carried is not None:
            carried.told()

    def _ack_before_leaving(self) -> None:
        """The last batch's ack, on the way out; if Redis does not take it, the leases run out (or
        the heartbeat hands them over) and the row re-check lets the members go."""
        try:
            self.flush_acks()
        except QueueUnavailable as exc:
            logger.warning("Could not ack the last batch on leaving (%s); its members are taken over "
                           "and found closed.", exc)

    def _run_once(self, due_by: datetime | None) -> Claim:
        """``run_once``, the batch's ack left for the next claim: the loop goes straight on."""
        close_old_connections()
        try:
            if not self._pauses_loaded:
                # Before the first claim, from the database: a consumer (re)started during a pause
                # stays paused, whatever Redis holds.
                self.pauses.load()
                self._pauses_loaded = True
            started = time.perf_counter()
            now = self.clock()
            claim = self.claim(now, due_by)
            self.metrics.claimed(time.perf_counter() - started, len(claim.members))
            if claim.members:
                report = self.process(claim, now)
                self._log(self.kind_of(claim)[0], report, started)
            return claim
        finally:
            close_old_connections()

    @staticmethod
    def _release(kind: Kind, queue: TimeoutQueue, claim: Claim, now: datetime) -> None:
        """The database failed us, not the rows: put them back, due, without counting a takeover."""
        try:
            queue.reschedule(claim.token, {member: now_score(now) for member in claim.members})
        except QueueUnavailable:
            logger.warning("%s: could not put back %d claimed member(s): Redis is unreachable; they are taken "
                           "over when their lease runs out.", kind.label, len(claim.members))

    def _log(self, kind: Kind, report: Report, started: float) -> None:
        fields = {**self.stats.of(kind.name).named(report),
                  "elapsed_ms": round((time.perf_counter() - started) * 1000, 1)}
        what = kind.label
        logger.info(what + " " + " ".join(f"{name}=%s" for name in fields), *fields.values(),
                    extra={kind.wording.log_extra: fields})

    # -- the loop -------------------------------------------------------

    def run(self, once: bool = False) -> ConsumerStats:
        """Loop until stopped; with ``once``, until nothing is due, then return.

        Redis and database errors are logged and retried with backoff; in
        ``once`` mode they are raised, since the caller wants a verdict.
        """
        heartbeat = Heartbeat(self.lanes, self.consumer_id, self.heartbeat_seconds, self._wall_ms,
                              on_handed=self._woken, on_epoch_missing=self._queue_lost, on_beat=self.pauses.check)
        guard = self.watch.guard = LeaseGuard(self.queue, self.lease_seconds, lambda: now_score(self.clock()),
                                              on_stuck=self._exit_stuck if self.exit_when_stuck else None,
                                              time_limit=self.batch_time_limit)
        abandoning = False
        housekeeper = Housekeeper(self._stop, exit_when_stuck=self.exit_when_stuck) \
            if self.housekeeping and not once else None
        try:
            if not once:
                self._wait_for_migrations()
            if self.clock.follow_database:
                try:
                    self.sync_clock()
                except DatabaseError as exc:
                    if once:
                        raise
                    logger.warning("Could not read the database's clock yet (%s); going on.", one_line(exc))
            if not once:
                # Not for --once: what is due now, then gone; a killed one's batch waits its lease.
                heartbeat.start()
                self.watch.on_session = heartbeat.record_session
            if housekeeper is not None:
                housekeeper.start()
            if self.collections is not None:
                self.collections.start()  # what start-up allocated, its threads included, frozen
            return self._run(once=once)
        except BaseException:
            abandoning = True
            raise
        finally:
            if housekeeper is not None:
                self._stop.set()  # left raising too: a scan in hand stops between two chunks
            self._ack_before_leaving()
            if housekeeper is not None:
                housekeeper.close()
            if heartbeat.thread.is_alive():
                # Left raising (a second signal, a receiver stuck): its claims go to the others now.
                heartbeat.close(abandon=abandoning)
            guard.close()
            if self.collections is not None:
                self.collections.stop()
            self.watch.guard = None
            self.watch.on_session = None
            if self._listener is not None:
                self._listener.close()
                self._listener = None

    def _wait_for_migrations(self) -> None:
        """Started before ``manage.py migrate`` (a rolling upgrade): say which of the app's migrations
        the database lacks, once (and again every MIGRATIONS_REMINDER), and wait until they are
        applied, rather than fail on a missing table in every loop."""
        said_at: float | None = None
        while not self.stopping:
            try:
                missing = unapplied_migrations(router.db_for_write(DeadLetter))
            except DatabaseError as exc:
                logger.warning("Could not ask the database which migrations are applied (%s); going on.",
                               one_line(exc))
                return
            finally:
                close_old_connections()
            if not missing:
                if said_at is not None:
                    logger.info("The migrations are applied: starting.")
                return
            if said_at is None or time.monotonic() - said_at >= MIGRATIONS_REMINDER:
                logger.warning("Migrations not applied yet: %s. Run manage.py migrate: this consumer waits "
                               "for it before closing anything (asking every %.0fs).", named(missing),
                               MIGRATIONS_RECHECK)
                said_at = time.monotonic()
            self._stop.wait(MIGRATIONS_RECHECK)

    def _wall_ms(self) -> int:
        """This host's time corrected to the database's, never a test's stepped clock: the time every
        consumer's heartbeat is judged by (timers/heartbeats.py)."""
        return now_score(timezone.now() + self.clock.offset)

    @staticmethod
    def _exit_stuck(batch: WatchedBatch) -> None:
        """Leave the process now: the stuck thread cannot be freed, its leases are handed over."""
        exit_stuck()

    def _run(self, once: bool) -> ConsumerStats:
        backoff = ERROR_BACKOFF_FIRST
        # --once means "what is due now": a fixed cutoff, so a steady stream
        # of new deadlines cannot keep it running.
        due_by = self.clock() if once else None
        self._lets_gather = not once
        if not once and self._listener is None:
            # From the start, not at the first sleep: a consumer that starts into a backlog
            # hears of new work on a lane it found empty (a notice its closes wrote).
            self._listener = WakeListener(self.lanes, self._woken)
        while not self.stopping:
            try:
                if self._epoch_missing.is_set():
                    self._recover()
                claim = self._run_once(due_by)
                if self.collections is not None:
                    self.collections.between_batches()
            except (QueueUnavailable, DatabaseError) as exc:
                if once:
                    raise
                self.stats.errors += 1
                self.metrics.error("redis" if isinstance(exc, QueueUnavailable) else "database")
                # An outage is expected: one line with its cause per backoff step, no traceback.
                logger.warning("Timeout consumer batch failed (%s: %s); retrying in %.1fs.",
                               type(exc).__name__, one_line(exc), backoff)
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
            self.flush_acks()
            self._sleep(self._idle_wait(self.rota.earliest()))
        return self.stats

    def _refresh_due(self) -> bool:
        """Every MAX_WAIT, learn every lane's next score (one round trip): a lost wake-up heals."""
        if time.monotonic() - self._refreshed_at < self.max_wait:
            return False
        self._refreshed_at = time.monotonic()
        try:
            asked = self.rota.wakes()
            self.rota.refreshed(self.lanes.next_scores(), since=asked)
        except QueueUnavailable:
            return False
        return self.rota.has_due(now_score(self.clock()))

    def _pauses_changed(self, paused: frozenset[str]) -> None:
        """Claim none of the paused kinds' lanes from the next claim on (a batch in hand finishes)."""
        self.rota.pause([lane for lane, kind in enumerate(self._kind_of_lane) if kind.label in paused])
        served = sorted(name for name in paused if any(kind.label == name for kind in self.kinds))
        if served:
            logger.info("Paused here: %s (none of it is claimed until it is resumed).", ", ".join(served))
        else:
            logger.info("No timer of this consumer is paused.")
        self._wake.set()

    def _queue_lost(self) -> None:
        self._epoch_missing.set()
        self._wake.set()

    def _recover(self) -> None:
        """Rebuild a queue Redis lost (scans/recovery.py); the next beat asks again if not done."""
        self._epoch_missing.clear()
        close_old_connections()
        try:
            self.flush_acks()  # not left waiting for the rebuild
            if self.recovery.run():
                # What it put back is due now, on every lane.
                for lane in range(len(self.lanes.shards)):
                    self.rota.woke(lane)
        except (QueueUnavailable, DatabaseError):
            raise  # the loop's backoff; the next beat asks again
        except Exception:
            # A bug here must not stop the closes: logged, and asked again at the next beat.
            logger.exception("Could not rebuild the queue; closing on, trying again at the next beat.")
        finally:
            close_old_connections()

    def _woken(self, lane: int) -> None:
        self.rota.woke(lane)
        self._wake.set()

    def _sleep(self, seconds: float) -> None:
        """Sleep until ``seconds`` pass, a new earliest deadline is scheduled, or a stop."""
        self._wake.wait(seconds)
        if not self.stopping:
            self._wake.clear()

    def _idle_wait(self, next_score: int | None) -> float:
        """Seconds to sleep: until the next deadline in Redis and the batch window, at most ``max_wait``."""
        if next_score is None:
            return self.max_wait
        wait = (next_score - now_score(self.clock())) / 1000 + self.batch_window
        return min(max(wait, 0.0), self.max_wait)

