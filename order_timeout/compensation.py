"""The compensation scan: the low-frequency safety net under the Redis trigger (seeds 000, 002).

Close mode finds unpaid orders overdue by more than ``COMPENSATION_GRACE`` and
closes them through ``closing.close_expired``, the consumer's own path (same
row locks, same status check, same ``order_expired``). Rebuild mode puts every
unpaid order with a future deadline that is missing from Redis back into the
pending set, after Redis lost its data. Both walk the ``(status, expires_at)`` index in keyset-paginated
chunks, never OFFSET and never the whole table in memory, and hold a Redis
lock so two scans never run at once.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, nullcontext
from dataclasses import asdict, dataclass
from datetime import datetime, timedelta
from typing import Any

from django.db import router
from django.db.models import QuerySet
from django.utils import timezone

from . import deadletters, get_order_model
from .closing import close_expired
from .codec import deadline_score, now_score, order_member, reminder_member
from .conf import settings
from .dbsession import limited_session
from .exceptions import QueueUnavailable, RepeatedTakeover
from .keys import REMIND
from .keyset import rows_by_deadline
from .models import DeadLetter, Reminder, TimeoutOrderMixin
from .queue import TimeoutQueue
from .stuck import Watchdog, exit_stuck, stuck_after, watchdog

logger = logging.getLogger("order_timeout")

# progress(done, total): called after each chunk.
Progress = Callable[[int, int], None]


@dataclass
class ScanResult:
    mode: str
    dry_run: bool = False
    # Another scan held the lock: this one did nothing.
    skipped: bool = False
    # False when Redis was unreachable and the close scan ran (on) without the lock.
    locked: bool = True
    # The lock expired under us (a chunk outlived COMPENSATION_LOCK_SECONDS) and
    # another scan may have taken it: this one stopped early.
    lock_lost: bool = False
    examined: int = 0
    closed: int = 0
    skipped_paid: int = 0
    not_due: int = 0
    # Overdue, but a payment in flight holds them (HOLD_CONDITION): left open, and back on
    # the queue for the consumers to look at again.
    held: int = 0
    failed: int = 0
    # Rebuild: members put back into Redis (or, with dry_run, that would be).
    restored: int = 0
    # The same for reminders (ORDER_TIMEOUT["REMINDERS"]) not sent yet.
    reminders_restored: int = 0
    # Overdue, but Redis shows a consumer on them (a retry in backoff, a lease): left alone.
    left_to_consumers: int = 0
    # Overdue, but open dead letters: staff decide.
    left_as_dead_letters: int = 0
    # Buried because scans kept dying while closing them.
    dead_lettered: int = 0
    # Overdue orders the scan took because Redis did not hold them at all.
    missing_from_redis: int = 0
    elapsed_ms: float = 0.0

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


class CompensationScan:
    """One run of the scan; ``run()`` takes the lock, walks the index, releases the lock."""

    def __init__(
        self,
        *,
        rebuild: bool = False,
        heal: bool = False,
        dry_run: bool = False,
        model: type[TimeoutOrderMixin] | None = None,
        queue: TimeoutQueue | None = None,
        now: datetime | None = None,
        grace: float | None = None,
        chunk_size: int | None = None,
        progress: Progress | None = None,
        exit_when_stuck: bool = False,
    ) -> None:
        self.model = model or get_order_model()
        self.queue = queue or TimeoutQueue.from_settings()
        self.now = now or timezone.now()
        self.grace = timedelta(seconds=settings.COMPENSATION_GRACE if grace is None else grace)
        self.chunk_size = chunk_size or settings.COMPENSATION_CHUNK
        self.progress = progress
        # For a process that is only this scan (the management command): a receiver
        # stuck in its thread ends the process, as it ends run_timeout_consumer.
        self.exit_when_stuck = exit_when_stuck
        self._token: str | None = None
        self.lock_ms = round(1000 * settings.COMPENSATION_LOCK_SECONDS)
        self.result = ScanResult(mode="heal" if heal else "rebuild" if rebuild else "close",
                                 dry_run=dry_run)
        # Healing restores only what is due before the next scan could: anything
        # further ahead is restored by a later scan, still before its deadline.
        self.rebuild_until = (self.now + timedelta(seconds=2 * settings.COMPENSATION_INTERVAL)
                              + self.grace) if heal else None

    def run(self) -> ScanResult:
        started = timezone.now()
        token = self._token = uuid.uuid4().hex
        try:
            if not self.queue.acquire_lock(token, self.lock_ms):
                logger.info("compensation scan skipped: another scan holds the lock")
                self.result.skipped = True
                return self.result
        except QueueUnavailable as error:
            if self.result.mode == "rebuild":
                raise
            # The database is the truth: the safety net must work when Redis does not.
            logger.warning("compensation scan running without its lock: Redis is unreachable "
                           "(%s)", error)
            self.result.locked = False
        try:
            if self.result.mode == "rebuild":
                self._rebuild(token)
            elif self.result.mode == "heal" and self.result.locked:
                try:
                    self._rebuild(token)
                except QueueUnavailable as error:
                    logger.warning("compensation scan lost Redis while restoring members (%s); "
                                   "closing what is overdue without it", error)
                    self.result.locked = False
            if self.result.mode in ("close", "heal") and not self.result.lock_lost:
                self._close_overdue(token)
        finally:
            self._release(token)
        if self.result.mode == "heal" and self.result.locked and not self.result.dry_run:
            try:
                self.queue.record_drift(self.result.restored + self.result.missing_from_redis)
            except QueueUnavailable as error:
                logger.warning("compensation scan could not record the drift (%s)", error)
        self.result.elapsed_ms = round((timezone.now() - started).total_seconds() * 1000, 1)
        logger.info("compensation scan " + " ".join(f"{k}=%s" for k in self.result.as_dict()),
                    *self.result.as_dict().values(), extra={"scan": self.result.as_dict()})
        return self.result

    def _walk(self, queryset: QuerySet[Any], token: str, *,
              needs_redis: bool) -> Iterator[list[tuple[Any, datetime]]]:
        """The rows in chunks, the lock renewed before each. ``needs_redis``: restoring members
        cannot go on without Redis (raise); closing can (go on without the lock)."""
        total = queryset.count() if self.progress else 0
        for rows in rows_by_deadline(queryset, self.chunk_size):
            # Renewed before each chunk, so the lock outlives any chunk that
            # takes less than COMPENSATION_LOCK_SECONDS.
            if not self._renew(token, needs_redis=needs_redis):
                return
            yield rows
            self.result.examined += len(rows)
            if self.progress:
                self.progress(self.result.examined, max(total, self.result.examined))

    def _renew(self, token: str, *, needs_redis: bool) -> bool:
        """Keep the lock; False when another scan may hold it now, so this one stops."""
        if not self.result.locked:
            return True
        try:
            if self.queue.renew_lock(token, self.lock_ms):
                return True
        except QueueUnavailable as error:
            if needs_redis:
                raise
            logger.warning("compensation scan lost Redis (%s); going on without the lock", error)
            self.result.locked = False
            return True
        logger.warning("compensation scan lost its lock (a chunk outlived it); stopping")
        self.result.lock_lost = True
        return False

    def _release(self, token: str) -> None:
        if not self.result.locked or self.result.lock_lost:
            return
        try:
            self.queue.release_lock(token)
        except QueueUnavailable as error:
            # It expires by itself after COMPENSATION_LOCK_SECONDS.
            logger.warning("compensation scan could not release its lock (%s)", error)

    def _orders(self) -> QuerySet[Any]:
        # The primary: a replica may lag behind the closes this scan makes.
        return self.model._base_manager.db_manager(router.db_for_write(self.model)).all()

    def _close_overdue(self, token: str) -> None:
        overdue = self._orders().filter(self.model.unpaid_q(), expires_at__lt=self.now - self.grace)
        for rows in self._walk(overdue, token, needs_redis=False):
            members = {order_member(self.model, pk): pk for pk, _ in rows}
            dropped = self._dropped_by_consumers(members)
            if self.result.dry_run or not dropped:
                continue
            # Closed in one batch; those an earlier scan started on and never
            # finished (its process died) one at a time, or buried.
            earlier = self._scans_started(dropped)
            fresh = {member: pk for member, pk in dropped.items() if not earlier.get(member)}
            self._close_counted(fresh)
            # Fewest earlier scans first: the orders a stuck scan left behind close
            # before the suspect that held it.
            for member, pk in sorted(dropped.items(), key=lambda item: earlier.get(item[0], 0)):
                if earlier.get(member, 0) > settings.MAX_TAKEOVERS:
                    self._bury(pk, earlier[member])
                    self._bookkeep("done_scanning", {member: pk})
                elif earlier.get(member):
                    self._close_counted({member: pk})

    def _close_counted(self, members: dict[str, Any]) -> None:
        """Close these in one batch, counted in Redis so a scan that dies doing it is known."""
        if members:
            self._bookkeep("start_scanning", members)
            self._close([list(members.values())])
            self._bookkeep("done_scanning", members)

    def _close(self, batches: list[list[Any]]) -> None:
        for pks in batches:
            # A receiver that hangs here must not hold these rows locked for long:
            # the database ends the transaction after LEASE_SECONDS, as for a consumer.
            with (limited_session(router.db_for_write(self.model), settings.LEASE_SECONDS),
                  self._watch(len(pks)) as dog):
                outcome = close_expired(self.model, pks, progress=dog.pet if dog else None)
            self.result.closed += len(outcome.closed)
            self.result.skipped_paid += len(outcome.settled)
            self.result.not_due += len(outcome.not_due)
            self.result.held += len(outcome.held)
            self._keep_looking(outcome.held)
            self.result.failed += len(outcome.failed)
            for pk, error in outcome.failed.items():
                logger.warning("compensation scan could not close order=%s error=%s: %s",
                               pk, type(error).__name__, error, exc_info=error)
            self._forget([*outcome.closed, *outcome.settled])
            deadletters.resolve_settled(self.model, outcome.closed, outcome.settled, self.now)

    def _watch(self, size: int) -> AbstractContextManager[Watchdog | None]:
        """Exit the process when one order's receivers keep the chunk for longer than a lease.

        Petted after every order's receivers: a chunk that is slow because it
        is large keeps going; one stuck on an order does not. The database
        ends a transaction idle for LEASE_SECONDS; a receiver still in hand a
        while later is stuck outside it, for good.
        """
        if not self.exit_when_stuck:
            return nullcontext()
        seconds = settings.LEASE_SECONDS + stuck_after(settings.LEASE_SECONDS)

        def stuck() -> None:
            logger.critical(
                "compensation scan: a chunk of %d orders has closed no order for %.0fs: a "
                "receiver is stuck outside the database. Exiting; the next scan closes these "
                "orders one at a time and buries the stuck one after MAX_TAKEOVERS scans.",
                size, seconds)
            if self._token is not None:
                self._release(self._token)  # the next beat need not wait for the lock to run out
            exit_stuck()

        return watchdog(seconds, stuck)

    def _dropped_by_consumers(self, members: dict[str, Any]) -> dict[str, Any]:
        """The overdue orders no consumer is handling: the scan's to close.

        Not an open dead letter (staff decide those). And, as far as Redis
        tells: not waiting in pending, nor leased, since less than the grace
        ago (a retry in backoff, a busy row put back, a batch in hand).
        Missing from Redis, or left there that long, means no consumer will.
        """
        buried = set(DeadLetter.objects.filter(
            order_model=self.model._meta.label, order_id__in=list(members), resolved_at__isnull=True,
        ).values_list("order_id", flat=True))
        candidates = {member: pk for member, pk in members.items() if member not in buried}
        self.result.left_as_dead_letters += len(members) - len(candidates)
        if not self.result.locked:
            return candidates
        try:
            positions = self.queue.positions(candidates)
        except QueueUnavailable as error:
            logger.warning("compensation scan lost Redis (%s); closing what the database says is "
                           "overdue", error)
            self.result.locked = False
            return candidates
        cutoff = now_score(self.now - self.grace)
        dropped = {member: pk for member, pk in candidates.items()
                   if all(at is None or at <= cutoff
                          for at in (positions[member].pending_ms, positions[member].lease_ms))}
        self.result.missing_from_redis += sum(1 for member in dropped if positions[member].missing)
        self.result.left_to_consumers += len(candidates) - len(dropped)
        return dropped

    def _scans_started(self, members: dict[str, Any]) -> dict[str, int]:
        if not self.result.locked:
            return {}
        try:
            return self.queue.scans_started(members)
        except QueueUnavailable:
            return {}

    def _bookkeep(self, step: str, members: dict[str, Any]) -> None:
        if self.result.locked:
            try:
                getattr(self.queue, step)(members)
            except QueueUnavailable as error:
                logger.warning("compensation scan could not keep its books in Redis (%s)", error)

    def _bury(self, pk: Any, scans: int) -> None:
        error = RepeatedTakeover(
            f"{scans} compensation scans died while closing it (a receiver that exits the "
            "process or runs out of memory?); not tried again.")
        burial = deadletters.record(
            self.model, [deadletters.Failure(pk, scans, now_score(self.now), error)], self.now)
        if burial.buried:
            logger.error("compensation scan: order=%s dead-lettered after %d scans died with it.",
                         pk, scans)
        self.result.dead_lettered += len(burial.buried)
        self.result.skipped_paid += len(burial.settled)

    def _keep_looking(self, held: dict[Any, datetime]) -> None:
        """Put held orders Redis lost back in, due now: the consumers hold them or close them."""
        if not held or not self.result.locked:
            return
        try:
            self.queue.schedule({order_member(self.model, pk): now_score(self.now) for pk in held},
                                only_missing=True)
        except QueueUnavailable as error:
            logger.warning("compensation scan could not put held orders back in Redis (%s)", error)

    def _forget(self, pks: list[Any]) -> None:
        """Members of orders settled here need not wait for the consumer to drop them."""
        if not pks or not self.result.locked:
            return
        try:
            self.queue.unschedule(order_member(self.model, pk) for pk in pks)
        except QueueUnavailable as error:
            logger.warning("compensation scan could not clean up Redis (%s)", error)

    def _rebuild(self, token: str) -> None:
        # Future deadlines only: overdue orders are the close scan's (and a
        # dead-lettered one must not be retried behind the staff's back).
        leads = settings.reminders()
        upcoming = self._orders().filter(self.model.unpaid_q(), expires_at__gt=self.now)
        if self.rebuild_until is not None:
            # Reminders fall due before their deadlines: look that much further ahead for them.
            reach = timedelta(milliseconds=max(leads, default=0))
            upcoming = upcoming.filter(expires_at__lte=self.rebuild_until + reach)
        for rows in self._walk(upcoming, token, needs_redis=True):
            closes = [(pk, expires_at) for pk, expires_at in rows
                      if self.rebuild_until is None or expires_at <= self.rebuild_until]
            self.result.restored += self._restore(self.queue, {
                order_member(self.model, pk): deadline_score(expires_at) for pk, expires_at in closes})
            if leads:
                self.result.reminders_restored += self._restore(
                    self.queue.of_kind(REMIND), self._reminders_to_send(rows, leads))

    def _restore(self, queue: TimeoutQueue, scores: dict[str, int]) -> int:
        """Put back the members Redis lost, or holds at a score no deadline can have; how many
        (with dry_run: would)."""
        positions = queue.positions(scores)
        missing = [member for member, where in positions.items() if where.missing and not where.unreadable]
        unreadable = [member for member, where in positions.items() if where.unreadable]
        if self.result.dry_run:
            return len(missing) + len(unreadable)
        # NX: a member that came back since positions() keeps its score. A score past any
        # deadline (+inf) is lowered to the row's (the schedule script's ZADD LT).
        queue.schedule({member: scores[member] for member in unreadable})
        return len(unreadable) + queue.schedule({member: scores[member] for member in missing},
                                                only_missing=True)

    def _reminders_to_send(self, rows: list[tuple[Any, datetime]], leads: list[int]) -> dict[str, int]:
        """The reminder members of these orders, not sent (nor passed over) for their deadline yet.

        Due at their moment, which may be past already: then at once (the
        deadline is still ahead, or the order would not be here; the consumer
        looks again, and never sends one after its deadline).
        """
        done = set(Reminder.objects.filter(
            order_model=self.model._meta.label, order_id__in=[str(pk) for pk, _ in rows],
        ).values_list("order_id", "lead_ms", "deadline"))
        return {reminder_member(self.model, pk, lead): deadline_score(expires_at) - lead
                for pk, expires_at in rows for lead in leads
                if (str(pk), lead, expires_at) not in done}


def compensate(**options: Any) -> ScanResult:
    """Run one compensation scan; see ``CompensationScan`` for the options."""
    return CompensationScan(**options).run()
