"""The compensation scan: the low-frequency safety net under the Redis trigger (seeds 000, 002).

For every kind of timer. Close mode finds the rows still pending whose
deadline passed more than ``COMPENSATION_GRACE`` ago and acts on those no
consumer handles, through ``timers.acting.act_on``, the consumer's own path
(same row locks, same re-check, same receivers). Rebuild mode puts every
pending row with a future deadline that is missing from Redis back into its
kind's pending set, after Redis lost its data. Both walk each kind's
deadlines in keyset-paginated chunks, never OFFSET and never a whole table in
memory, and hold one Redis lock so two scans never run at once.

Close mode starts its walk where the last scan left nothing but open dead letters
behind (``Housekeeping.scan_mark``), so the rows waiting for staff are not read
again on every run; every ``COMPENSATION_FULL_INTERVAL`` it walks from the oldest.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, nullcontext
from dataclasses import asdict, dataclass, field
from datetime import datetime, timedelta
from typing import Any

from django.utils import timezone

from ..conf import settings
from ..db.primary import on_primary
from ..db.session import limited_session
from ..exceptions import QueueUnavailable, RepeatedTakeover
from ..models import DeadLetter, TimeoutOrderMixin
from ..queue import TimeoutQueue
from ..queue.housekeeping import ScanMark
from ..redaction import one_line
from ..timers.acting import act_on
from ..timers.closes import OrderTimeout
from ..timers.giving_up import Failure
from ..timers.kind import Kind
from ..timers.members import datetime_of_score, now_score
from ..timers.pausing import paused_names
from ..timers.registry import registry
from ..timers.reminders import Reminders
from ..timers.retrying import Retrier
from ..timers.staff import resolve_settled
from ..timers.watchdog import Watchdog, exit_stuck, stuck_after, watchdog
from . import walks

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
    # Its process was stopping (a consumer's SIGTERM): it stopped between two chunks.
    stopped: bool = False
    # The order close's figures (every kind's in ``timers``):
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
    # Dead-lettered: failed after the last of RETRY_DELAYS (the consumers' rule), or scans kept
    # dying while acting on them.
    dead_lettered: int = 0
    # Overdue rows the scan took because Redis did not hold them at all.
    missing_from_redis: int = 0
    # Dry run: the overdue rows no consumer handles, which the scan would act on.
    would_act: int = 0
    # Whether the order close was scanned (False when ORDER_MODEL is None): its figures are the above.
    closes_orders: bool = True
    # Paused by staff: its overdue rows were left alone (members put back, none acted on).
    paused: bool = False
    elapsed_ms: float = 0.0
    # Each timer a shop declared: its own figures (the same fields, by name).
    timers: dict[str, ScanResult] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        figures = asdict(self)
        for own in figures["timers"].values():
            # A timer's figures are its own: whether the order close was scanned is said once, above.
            del own["closes_orders"], own["timers"]
        return figures

    def figures(self, kind: Kind) -> ScanResult:
        """Where ``kind``'s figures go: this result for the app's own kinds, else its own."""
        if isinstance(kind, (OrderTimeout, Reminders)):
            return self
        return self.timers.setdefault(kind.name, ScanResult(mode=self.mode, dry_run=self.dry_run))


class CompensationScan:
    """One run of the scan; ``run()`` takes the lock, walks every kind's deadlines, releases the lock."""

    def __init__(
        self,
        *,
        rebuild: bool = False,
        heal: bool = False,
        full: bool = False,
        dry_run: bool = False,
        model: type[TimeoutOrderMixin] | None = None,
        queue: TimeoutQueue | None = None,
        now: datetime | None = None,
        grace: float | None = None,
        chunk_size: int | None = None,
        progress: Progress | None = None,
        exit_when_stuck: bool = False,
        kinds: list[Kind] | None = None,
        from_oldest: bool = False,
        held_lock: str | None = None,
        stop: threading.Event | None = None,
        pace: float | None = None,
    ) -> None:
        # The order close (and its reminders) of ``model`` when it is not ORDER_MODEL.
        self.kinds = registry.kinds_for(model, kinds)
        self.queue = queue or TimeoutQueue.from_settings()
        self.now = now or timezone.now()
        self.grace = timedelta(seconds=settings.COMPENSATION_GRACE if grace is None else grace)
        self.chunk_size = chunk_size or settings.COMPENSATION_CHUNK
        self.progress = progress
        # For a process that is only this scan (the management command): a receiver
        # stuck in its thread ends the process, as it ends run_timeout_consumer.
        self.exit_when_stuck = exit_when_stuck
        self._token: str | None = None
        # The token of the fleet's turn (scans/turns.py), taken already: its lock is this scan's,
        # released by the turn's end, which records the run.
        self.held_lock = held_lock
        # Set when the process stops: the scan stops between two chunks.
        self.stop = stop
        # The share of the wall clock the walk may take (None: all of it): after each chunk it rests
        # for as long again as the chunk took, times (1 - pace) / pace. A consumer's housekeeping
        # thread sets it, so that the closes beside it keep the CPU and the interpreter's lock.
        if pace is not None and not 0 < pace <= 1:
            raise ValueError(f"pace must be in (0, 1], not {pace!r}")
        self.pace = pace
        self.lock_ms = round(1000 * settings.COMPENSATION_LOCK_SECONDS)
        # A failure the scan meets is leased to it this long while its retry is counted.
        self.lease_ms = round(1000 * settings.LEASE_SECONDS)
        self.retrier = Retrier.from_settings()
        self.result = ScanResult(mode="heal" if heal else "rebuild" if rebuild else "close",
                                 dry_run=dry_run, closes_orders=any(isinstance(kind, OrderTimeout)
                                                                    for kind in self.kinds))
        # Healing restores only what is due before the next scan could: anything
        # further ahead is restored by a later scan, still before its deadline.
        # ``full``: a consumer's rebuild of a queue Redis lost: every future deadline, and every
        # overdue row missing from Redis put back due (with ``heal``).
        self.full = full
        # Walk every overdue row from the oldest, not from where the last scan left only dead letters.
        self.from_oldest = from_oldest
        self.rebuild_until = (self.now + timedelta(seconds=2 * settings.COMPENSATION_INTERVAL)
                              + self.grace) if heal and not full else None

    def queue_of(self, kind: Kind) -> TimeoutQueue:
        return self.queue if kind.key_space == self.queue.kind else self.queue.of_kind(kind.key_space)

    def run(self) -> ScanResult:
        started = timezone.now()
        token = self._token = self.held_lock or uuid.uuid4().hex
        try:
            if self.held_lock is None and not self.queue.acquire_lock(token, self.lock_ms):
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
                self._rebuild_all(token)
            elif self.result.mode == "heal" and self.result.locked:
                try:
                    self._rebuild_all(token)
                except QueueUnavailable as error:
                    logger.warning("compensation scan lost Redis while restoring members (%s); "
                                   "closing what is overdue without it", error)
                    self.result.locked = False
            if self.result.mode in ("close", "heal"):
                paused = paused_names()
                for kind in self.kinds:
                    if self.result.lock_lost or self.result.stopped:
                        break
                    if kind.label in paused and not self.full:
                        # Staff paused it: its rows wait, as the consumers' claims do. (A rebuild
                        # of a queue Redis lost puts its overdue members back all the same: its
                        # flags, set first, keep every claim off them until the resume.)
                        self.result.figures(kind).paused = True
                        continue
                    self._close_overdue(kind, token)
        finally:
            self._release(token)
        if self.result.mode == "heal" and self.result.locked and not self.result.dry_run:
            try:
                for kind in self.kinds:
                    figures = self.result.figures(kind)
                    if not isinstance(kind, Reminders):
                        self.queue_of(kind).record_drift(figures.restored + figures.missing_from_redis)
            except QueueUnavailable as error:
                logger.warning("compensation scan could not record the drift (%s)", error)
        self.result.elapsed_ms = round((timezone.now() - started).total_seconds() * 1000, 1)
        logger.info("compensation scan " + " ".join(f"{k}=%s" for k in self._logged()),
                    *self._logged().values(), extra={"scan": self.result.as_dict()})
        return self.result

    def _logged(self) -> dict[str, Any]:
        return {name: value for name, value in self.result.as_dict().items() if name != "timers" or value}

    def _walk(self, chunks: Iterator[list[tuple[Any, datetime]]], token: str, figures: ScanResult, *,
              needs_redis: bool, total: Callable[[], int] | None = None) -> Iterator[list[tuple[Any, datetime]]]:
        """The rows in chunks, the lock renewed before each. ``needs_redis``: restoring members
        cannot go on without Redis (raise); closing can (go on without the lock)."""
        count = total() if self.progress and total else 0
        since = time.monotonic()
        for rows in chunks:
            since = self._rest(since)
            if self.stop is not None and self.stop.is_set():
                self.result.stopped = True
                return
            # Renewed before each chunk, so the lock outlives any chunk that
            # takes less than COMPENSATION_LOCK_SECONDS.
            if not self._renew(token, needs_redis=needs_redis):
                return
            yield rows
            figures.examined += len(rows)
            if self.progress:
                self.progress(figures.examined, max(count, figures.examined))

    def _rest(self, since: float) -> float:
        """With a ``pace``: rest for the share of the time since ``since`` (the last chunk's fetch and
        work) that keeps the walk to its pace; the stop ends the rest. The moment it ends."""
        if self.pace is not None and self.pace < 1:
            rest = (time.monotonic() - since) * (1 - self.pace) / self.pace
            if self.stop is not None:
                self.stop.wait(rest)
            else:
                time.sleep(rest)
        return time.monotonic()

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
        if not self.result.locked or self.result.lock_lost or self.held_lock is not None:
            return  # a turn's lock goes with the turn's end (scans/turns.py)
        try:
            self.queue.release_lock(token)
        except QueueUnavailable as error:
            # It expires by itself after COMPENSATION_LOCK_SECONDS.
            logger.warning("compensation scan could not release its lock (%s)", error)

    # -- close mode ----------------------------------------------------------------------------

    def _close_overdue(self, kind: Kind, token: str) -> None:
        figures = self.result.figures(kind)
        if isinstance(kind, Reminders):
            return  # a reminder overdue is never sent; the close scan closes its order
        before = self.now - self.grace
        mark = self._scan_mark(kind)
        since = None if mark is None else datetime_of_score(mark.from_ms - 1)
        # The earliest deadline this walk leaves to anyone but staff: where the next one starts.
        earliest: datetime | None = None
        chunks = walks.overdue(kind, before, self.chunk_size, since)
        for rows in self._walk(chunks, token, figures, needs_redis=False,
                               total=lambda: walks.count(kind, before=before, after=since)):
            if not self.full and kind.label in paused_names():
                # Paused by staff while this scan ran: its next chunks wait, as the claims do.
                figures.paused = True
                return
            members = {kind.member(pk): pk for pk, _ in rows}
            buried = self._open_dead_letters(kind, rows)
            earliest = min([deadline for pk, deadline in rows if str(pk) not in buried]
                           + ([] if earliest is None else [earliest]), default=None)
            dropped = self._dropped_by_consumers(kind, members, figures, buried)
            if self.result.dry_run:
                figures.would_act += len(dropped)
                continue
            if not dropped:
                continue
            if self.full:
                # A queue Redis lost: put them back due, for every consumer to close at once
                # (in parallel, each row re-checked under its lock), rather than close them here.
                scores = kind.scores(rows)
                figures.restored += self._restore(self.queue_of(kind),
                                                  {member: scores[member] for member in dropped})
                continue
            # Acted on in one batch; those an earlier scan started on and never
            # finished (its process died) one at a time, or buried.
            queue = self.queue_of(kind)
            earlier = self._scans_started(queue, dropped)
            fresh = {member: pk for member, pk in dropped.items() if not earlier.get(member)}
            self._act_counted(kind, fresh, figures)
            # Fewest earlier scans first: the rows a stuck scan left behind go before the
            # suspect that held it.
            for member, pk in sorted(dropped.items(), key=lambda item: earlier.get(item[0], 0)):
                if earlier.get(member, 0) > settings.MAX_TAKEOVERS:
                    self._bury(kind, pk, earlier[member], figures)
                    self._bookkeep(queue, "done_scanning", {member: pk})
                elif earlier.get(member):
                    self._act_counted(kind, {member: pk}, figures)

        self._mark_walked(kind, mark, before if earliest is None else earliest)

    def _scan_mark(self, kind: Kind) -> ScanMark | None:
        """Where this walk starts: the last scan's mark, unless a full walk is due (None: from the
        oldest). A queue Redis lost (``full``) is walked whole: its members went with the mark."""
        if self.full or self.from_oldest or not self.result.locked:
            return None
        try:
            mark = self.queue_of(kind).housekeeping.scan_mark()
        except QueueUnavailable:
            return None
        if mark is None or now_score(self.now) - mark.full_ms >= 1000 * settings.COMPENSATION_FULL_INTERVAL:
            return None
        return mark

    def _mark_walked(self, kind: Kind, mark: ScanMark | None, start: datetime) -> None:
        """The next scan starts at ``start``: below it this walk left only open dead letters. Not
        after a dry run, a rebuild's walk, or a walk cut short (its end is not known to be clean)."""
        if self.result.dry_run or self.full or not self.result.locked or self.result.lock_lost:
            return
        full_ms = now_score(self.now) if mark is None else mark.full_ms
        try:
            self.queue_of(kind).housekeeping.set_scan_mark(ScanMark(now_score(start), full_ms))
        except QueueUnavailable as error:
            logger.warning("compensation scan could not record where the next one starts (%s); it walks "
                           "from the oldest", error)

    def _act_counted(self, kind: Kind, members: dict[str, Any], figures: ScanResult) -> None:
        """Act on these in batches of the kind's claim limit (all at once for most kinds), each
        counted in Redis so a scan that dies doing it is known. A kind that waits on the outside
        world (the notices: a claim's worth at once) has its lock renewed between its batches, so a chunk of
        slow deliveries never outlives the lock and has the next scan deliver them again."""
        size = kind.claim_limit or len(members) or 1
        items = list(members.items())
        for start in range(0, len(items), size):
            if start and not self._renew(self._token or "", needs_redis=False):
                return
            batch = dict(items[start:start + size])
            if kind.claim_limit:
                # Where the chunk's members were was read before its first batch; a slow batch
                # gives the consumers time to claim the later ones (put back by a heal, a
                # requeue): take each batch as it comes, and leave them what they hold.
                batch = self._take(kind, batch, figures)
            self._act_batch(kind, batch, figures, taken=bool(kind.claim_limit) and self.result.locked)

    def _take(self, kind: Kind, members: dict[str, Any], figures: ScanResult) -> dict[str, Any]:
        """Lease ``members`` to this scan, but those a consumer holds; the taken."""
        if not members or not self.result.locked or self._token is None:
            return members
        # Leased from now, not from the scan's start: a long scan's later batches need their whole lease.
        now_ms = now_score(timezone.now())
        try:
            taken = set(self.queue_of(kind).take(self._token, list(members), now_ms, now_ms + self.lease_ms))
        except QueueUnavailable as error:
            logger.warning("compensation scan lost Redis (%s); acting on what the database says is "
                           "overdue", error)
            self.result.locked = False
            return members
        figures.left_to_consumers += len(members) - len(taken)
        return {member: pk for member, pk in members.items() if member in taken}

    def _act_batch(self, kind: Kind, members: dict[str, Any], figures: ScanResult, *,
                   taken: bool = False) -> None:
        """``taken``: the members are leased to this scan (``_take``); what it does not settle here
        goes back to the consumers, due now (they judge it again under the row lock)."""
        if not members:
            return
        queue = self.queue_of(kind)
        self._bookkeep(queue, "start_scanning", members)
        # A receiver that hangs here must not hold these rows locked for long:
        # the database ends the transaction after BATCH_TIME_LIMIT, as for a consumer.
        with limited_session(kind.using, settings.batch_time_limit()), self._watch(len(members)) as dog:
            outcome = act_on(kind, list(members.values()), progress=dog.pet if dog else None)
        figures.closed += len(outcome.acted)
        figures.skipped_paid += len(outcome.settled) + len(outcome.kept)
        figures.not_due += len(outcome.not_due)
        figures.held += len(outcome.held)
        # Held, or settled by the settled condition with the deadline kept: the consumers look again.
        self._keep_looking(kind, {**outcome.held, **outcome.kept})
        figures.failed += len(outcome.failed)
        self._retry_or_give_up(kind, queue, outcome.failed, figures)
        self._forget(kind, [*outcome.acted, *outcome.settled])
        if taken:
            self._hand_back(kind, queue, [*outcome.held, *outcome.kept, *outcome.busy], outcome.not_due)
        resolve_settled(kind, outcome.acted, outcome.settled, self.now)
        self._bookkeep(queue, "done_scanning", members)

    def _hand_back(self, kind: Kind, queue: TimeoutQueue, look_again: list[Any],
                   not_due: dict[Any, datetime]) -> None:
        """Members this scan took and did not settle, back to pending for the consumers: those to look
        at again (held, kept, busy) due now, those not due yet at their time."""
        if not (look_again or not_due) or self._token is None:
            return
        now_ms = now_score(self.now)
        deadlines = {**{kind.member(pk): now_ms for pk in look_again},
                     **{kind.member(pk): now_score(at) for pk, at in not_due.items()}}
        try:
            queue.reschedule(self._token, deadlines)
        except QueueUnavailable as error:
            logger.warning("compensation scan could not hand members back (%s); their leases run out "
                           "and the consumers take them over", error)

    def _retry_or_give_up(self, kind: Kind, queue: TimeoutQueue, failed: dict[Any, BaseException],
                          figures: ScanResult) -> None:
        """The scan's failures follow the consumers' rule: each is leased to this scan, then put back
        on the queue after its next retry delay (the consumers, or the next scan, try again), and
        past the last delay given up through its kind, a dead letter that staff see."""
        if not failed:
            return
        unsettled = dict(failed)
        if self.result.locked and self._token is not None:
            by_key = {key: kind.member(key) for key in failed}
            now_ms = now_score(self.now)
            try:
                taken = set(queue.take(self._token, list(by_key.values()), now_ms, now_ms + self.lease_ms))
                ours = {key: error for key, error in failed.items() if by_key[key] in taken}
                figures.dead_lettered += self.retrier.retry_or_give_up(kind, queue, self._token, ours, by_key,
                                                                       self.now)
                unsettled = {key: error for key, error in failed.items() if key not in ours}
            except QueueUnavailable as unavailable:
                logger.warning("compensation scan could not count its failures in Redis (%s); the next scan "
                               "tries them again", unavailable)
        for key, error in unsettled.items():
            # Without Redis nothing counts the tries: the next scan tries again, and says so again,
            # in one line (the traceback at DEBUG).
            logger.error("compensation scan could not act on %s (%s) error=%s: %s; the next scan tries again",
                         kind.describe(key), kind.label, type(error).__name__, one_line(error))
            logger.debug("compensation scan could not act on %s (%s): its traceback", kind.describe(key),
                         kind.label, exc_info=error)

    def _watch(self, size: int) -> AbstractContextManager[Watchdog | None]:
        """Exit the process when one row's receivers keep the chunk for longer than a lease.

        Petted after every row's receivers (every kind's act does): a chunk
        that is slow because it is large keeps going; one stuck on a row does
        not. The database ends a transaction idle for BATCH_TIME_LIMIT; a receiver
        still in hand a while later is stuck outside it, for good.
        """
        if not self.exit_when_stuck:
            return nullcontext()
        limit = settings.batch_time_limit()
        seconds = limit + stuck_after(limit)

        def stuck() -> None:
            logger.critical(
                "compensation scan: a chunk of %d rows has been acted on for %.0fs without progress: a "
                "receiver is stuck outside the database. Exiting; the next scan acts on these rows "
                "one at a time and buries the stuck one after MAX_TAKEOVERS scans.",
                size, seconds)
            if self._token is not None:
                self._release(self._token)  # the next beat need not wait for the lock to run out
            exit_stuck()

        return watchdog(seconds, stuck)

    @staticmethod
    def _open_dead_letters(kind: Kind, rows: list[tuple[Any, datetime]]) -> set[str]:
        """The keys, as text, of those of ``rows`` that are open dead letters: staff decide them."""
        return set(on_primary(DeadLetter).filter(
            order_model=kind.model._meta.label, timer=kind.name, order_id__in=[str(pk) for pk, _ in rows],
            resolved_at__isnull=True,
        ).values_list("order_id", flat=True))

    def _dropped_by_consumers(self, kind: Kind, members: dict[str, Any], figures: ScanResult,
                              buried: set[str]) -> dict[str, Any]:
        """The overdue rows no consumer is handling: the scan's to act on.

        Not an open dead letter (``buried``: staff decide those). And, as far
        as Redis tells: not waiting in pending, nor leased, since less than the
        grace ago (a retry in backoff, a busy row put back, a batch in hand).
        Missing from Redis, or left there that long, means no consumer will.
        """
        candidates = {member: pk for member, pk in members.items() if str(pk) not in buried}
        figures.left_as_dead_letters += len(members) - len(candidates)
        if not self.result.locked:
            return candidates
        try:
            positions = self.queue_of(kind).positions(candidates)
        except QueueUnavailable as error:
            logger.warning("compensation scan lost Redis (%s); acting on what the database says is "
                           "overdue", error)
            self.result.locked = False
            return candidates
        cutoff = now_score(self.now - self.grace)
        dropped = {member: pk for member, pk in candidates.items()
                   if (positions[member].missing if self.full
                       else all(at is None or at <= cutoff
                                for at in (positions[member].pending_ms, positions[member].lease_ms)))}
        figures.missing_from_redis += sum(1 for member in dropped if positions[member].missing)
        figures.left_to_consumers += len(candidates) - len(dropped)
        return dropped

    def _scans_started(self, queue: TimeoutQueue, members: dict[str, Any]) -> dict[str, int]:
        if not self.result.locked:
            return {}
        try:
            return queue.scans_started(members)
        except QueueUnavailable:
            return {}

    def _bookkeep(self, queue: TimeoutQueue, step: str, members: dict[str, Any]) -> None:
        if self.result.locked:
            try:
                getattr(queue, step)(members)
            except QueueUnavailable as error:
                logger.warning("compensation scan could not keep its books in Redis (%s)", error)

    def _bury(self, kind: Kind, pk: Any, scans: int, figures: ScanResult) -> None:
        error = RepeatedTakeover(
            f"{scans} compensation scans died while acting on it (a receiver that exits the "
            "process or runs out of memory?); not tried again.")
        burial = kind.give_up([Failure(pk, scans, now_score(self.now), error)], self.now)
        if burial.buried:
            logger.error("compensation scan: %s dead-lettered after %d scans died with it (%s).",
                         kind.describe(pk), scans, kind.label)
        figures.dead_lettered += len(burial.buried)
        figures.skipped_paid += len(burial.settled)

    def _keep_looking(self, kind: Kind, held: dict[Any, datetime]) -> None:
        """Put held rows Redis lost back in, due now: the consumers hold them or act on them."""
        if not held or not self.result.locked:
            return
        try:
            self.queue_of(kind).schedule({kind.member(pk): now_score(self.now) for pk in held}, only_missing=True)
        except QueueUnavailable as error:
            logger.warning("compensation scan could not put held rows back in Redis (%s)", error)

    def _forget(self, kind: Kind, pks: list[Any]) -> None:
        """Members of rows settled here need not wait for the consumer to drop them."""
        if not pks or not self.result.locked:
            return
        try:
            self.queue_of(kind).unschedule(kind.member(pk) for pk in pks)
        except QueueUnavailable as error:
            logger.warning("compensation scan could not clean up Redis (%s)", error)

    # -- rebuild mode --------------------------------------------------------------------------

    def _rebuild_all(self, token: str) -> None:
        for kind in self.kinds:
            if self.result.lock_lost:
                return
            self._rebuild(kind, token)

    def _rebuild(self, kind: Kind, token: str) -> None:
        # Future deadlines only: overdue rows are the close scan's (and a dead-lettered one
        # must not be retried behind the staff's back).
        figures = self.result.figures(kind)
        reminders = isinstance(kind, Reminders)
        chunks = walks.upcoming(kind, self.now, self.rebuild_until, self.chunk_size)
        walk = (chunks if reminders  # the close's walk already counted these rows
                else self._walk(chunks, token, figures, needs_redis=True))
        for rows in walk:
            if reminders and not self._renew(token, needs_redis=True):
                return
            restored = self._restore(self.queue_of(kind), kind.scores(rows))
            if reminders:
                figures.reminders_restored += restored
            else:
                figures.restored += restored

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


def compensate(**options: Any) -> ScanResult:
    """Run one compensation scan; see ``CompensationScan`` for the options."""
    return CompensationScan(**options).run()
