"""The notices: each delivered by its handler, at least once, outside any database transaction.

A kind like the others (claim -> lock -> judge -> act -> settle), whose rows
are ``order_timeout.Notice`` and whose act calls the outside world: so it
says ``acts_outside_transaction``. Its lock, under a short transaction, takes
the due notices still pending (and whose object still meets its handler's
``pending``, for a notice due later), counts the attempt and commits; then
each handler runs, with no transaction and no row lock held, all of a batch
at once in a pool of threads (so a batch takes as long as its slowest
handler, which its ``timeout`` bounds); then one UPDATE marks the delivered.

A process that dies between a delivery and that UPDATE leaves the notice
pending and its member leased: it is delivered again after a takeover, with
the same key. That is "at least once": the database's effects once, the
outside world's at least once, with a key to recognise a repeat by.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from datetime import datetime
from typing import Any, ClassVar

from django.apps import apps
from django.db import DatabaseError, close_old_connections, connections, transaction
from django.db.models import F, Q
from django.utils import timezone

from ..conf import settings
from ..db.keys import KeysIn
from ..db.locks import LockedOrders
from ..models import Notice
from ..notices.delivery import Delivery, Rejected
from ..notices.registry import handlers
from ..queue.keys import NOTICE
from ..reporting import wording as words
from .kind import Kind
from .outcome import Due, Key, Outcome

logger = logging.getLogger("order_timeout")

# Notices one claim takes, all delivered at once, each on a thread of the pool: a batch lasts as
# long as its slowest handler (bounded by its timeout, which check W012 keeps well inside a batch's time limit).
# 32: a claim's own cost (its Lua call, two short transactions, the ack) is spread over 32
# deliveries; in the benchmark's 100,000-notice burst that delivered them in 44 s, against 49 s
# with 16 (and 40 s with 64, whose 64 connections a consumer a shop's target may not accept).
DELIVERIES_AT_ONCE = 32


class Notices(Kind):
    name = "notices"
    queue_name = NOTICE
    deadline = "due_at"
    pending = Q(state=Notice.State.PENDING)
    acts_outside_transaction: ClassVar[bool] = True
    claim_limit: ClassVar[int | None] = DELIVERIES_AT_ONCE
    # A notice tells of a commit that already happened; a burst of closes goes first (a delivery
    # costs a consumer far more than a close), and a notice waits a second behind it at most.
    yields: ClassVar[bool] = True

    def __init__(self) -> None:
        super().__init__()
        self._pool: ThreadPoolExecutor | None = None
        # Handlers run on the caller's thread, not the pool's (``delivering_here``).
        self._here = False

    @property
    def model(self) -> Any:  # type: ignore[override]
        return Notice

    @property
    def wording(self) -> words.Wording:
        return words.NOTICES

    def describe(self, key: Key) -> str:
        return f"notice={key}"

    def queue_written(self, using: str, pks: Sequence[Any], due: datetime) -> None:
        """Notices just written (``notify()``): each member reaches Redis twice, now, a lease late, and
        at its time once the transaction commits. A process that dies between the COMMIT and its
        after-commit work (a deploy's SIGKILL, the OOM killer) leaves the notice to a consumer a
        lease later, not to the scan."""
        deadlines = self.scores([(pk, due) for pk in pks])
        self.announce(deadlines)
        self.schedule_members(using, deadlines)

    def announce(self, deadlines: Mapping[str, int]) -> None:
        """In the writing transaction, before its commit: each notice's member at its time plus a
        lease (LT: never later than one already there; no wake-up). Redis trouble is logged, never
        raised: the after-commit schedule, or the scan, still finds the notice."""
        from ..exceptions import QueueUnavailable
        from ..queue import TimeoutQueue

        late_ms = round(1000 * settings.LEASE_SECONDS)
        try:
            TimeoutQueue.for_saves().of_kind(self.key_space).announce(
                {member: score + late_ms for member, score in deadlines.items()})
        except QueueUnavailable as exc:
            logger.warning("Could not announce %d notice(s) before their commit (%s); they are scheduled "
                           "after it, or found by the compensation scan.", len(deadlines), exc)

    def schedule_members(self, using: str, deadlines: dict[str, int]) -> None:
        """After the commit on ``using``, these members at their scores (new notices: nothing to
        forget, no row to read again)."""
        from .syncing import follow_members

        follow_members(self, using, deadlines)

    def retry_delays(self) -> list[float]:
        return list(settings.NOTICE_RETRY_DELAYS)

    def gives_up_at_once(self, error: BaseException) -> bool:
        """The target refused it for good (``Rejected``): no retry would change its answer."""
        return isinstance(error, Rejected)

    def validate(self) -> None:
        pass  # handlers are checked where they are declared, and by check W012

    # -- under the short transaction ----------------------------------------------------------

    def judge(self, keys: Sequence[Key], locked: LockedOrders, outcome: Outcome) -> list[Due]:
        """The due notices still pending; those whose object no longer meets its handler's
        ``pending`` (the SMS confirmed meanwhile) are dropped, settled for good."""
        due = super().judge(keys, locked, outcome)
        dropped = set(_no_longer_wanted([notice for _key, notice in due]))
        if dropped:
            Notice.objects.using(self.using).filter(KeysIn(sorted(dropped))).update(state=Notice.State.DROPPED)
            outcome.settled += [key for key, _notice in due if key in dropped]
            for key in dropped:
                outcome.moments.pop(key, None)
        return [(key, notice) for key, notice in due if key not in dropped]

    def begin(self, due: list[Due], now: datetime) -> None:
        """In the lock's transaction, before any delivery: this attempt is counted on the row."""
        Notice.objects.using(self.using).filter(KeysIn([key for key, _notice in due])).update(
            attempts=F("attempts") + 1)

    # -- outside any transaction ----------------------------------------------------------------

    def deliver(self, due: list[Due], now: datetime, progress: Callable[[], None] | None = None
                ) -> dict[Key, BaseException]:
        """Run each notice's handler, all at once; mark the delivered; the failures, by key."""
        notices = [notice for _key, notice in due]
        objects = _objects_of(notices)
        answers: Iterable[tuple[Key, BaseException | None]]
        if self._here:
            answers = {notice.pk: _run(notice, objects.get((notice.object_model, notice.object_id)), tidy=False)
                       for notice in notices}.items()
        else:
            pool = self._threads()
            futures = {notice.pk: pool.submit(_run, notice, objects.get((notice.object_model, notice.object_id)))
                       for notice in notices}
            answers = ((pk, future.result()) for pk, future in futures.items())
        failed: dict[Key, BaseException] = {}
        for pk, error in answers:
            if error is not None:
                failed[pk] = error
            if progress is not None:
                progress()
        delivered = [notice.pk for notice in notices if notice.pk not in failed]
        try:
            self._record(delivered, failed)
        except DatabaseError:
            if connections[self.using].in_atomic_block:
                raise  # the caller's transaction: only the caller can end it
            # Most likely the session was ended under the deliveries: a batch that outran
            # BATCH_TIME_LIMIT is given up that way (timers/leases.py). What the handlers did is
            # recorded all the same, once more on a new session (the writes are idempotent), rather
            # than sent again; a database that is down fails this one too.
            connections[self.using].close()
            self._record(delivered, failed)
        return failed

    def _record(self, delivered: list[Key], failed: dict[Key, BaseException]) -> None:
        rejected = {pk: error for pk, error in failed.items() if isinstance(error, Rejected)}
        with transaction.atomic(using=self.using):
            if delivered:
                Notice.objects.using(self.using).filter(KeysIn(delivered), state=Notice.State.PENDING).update(
                    state=Notice.State.DELIVERED, delivered_at=timezone.now(), last_error="")
            for pk, error in failed.items():
                Notice.objects.using(self.using).filter(pk=pk).update(
                    last_error=f"{type(error).__name__}: {error}"[:2000],
                    **({"last_answer": rejected[pk].answer[:10_000]} if pk in rejected else {}))

    @contextmanager
    def delivering_here(self) -> Iterator[None]:
        """Run the handlers on this thread for a while, one after the other, on its connection: a
        test's (order_timeout.testing), whose transaction the pool's connections cannot see into."""
        here, self._here = self._here, True
        try:
            yield
        finally:
            self._here = here

    def _threads(self) -> ThreadPoolExecutor:
        if self._pool is None:
            self._pool = ThreadPoolExecutor(max_workers=DELIVERIES_AT_ONCE, thread_name_prefix="notice")
        return self._pool

    def act(self, due: list[Due], now: datetime, progress: Any = None) -> None:
        raise TypeError("notices are delivered outside the transaction (deliver()), never acted on inside it")


def _run(notice: Notice, obj: Any, *, tidy: bool = True) -> BaseException | None:
    """One handler, on a thread of the pool: None when it delivered, else what it raised. ``tidy``
    False: on the caller's thread, whose connection (and transaction) is the caller's to keep."""
    try:
        handler = handlers.get(notice.handler)
        # A notice about an object stores its reference alone; its payload names it.
        payload = {"model": notice.object_model, "pk": notice.object_id} if notice.object_model else notice.payload
        handler.send(Delivery(notice_id=notice.pk, handler=notice.handler, key=notice.key,
                              payload=payload, attempt=notice.attempts + 1, object=obj,
                              timeout=handler.timeout))
    except Exception as exc:  # noqa: BLE001 - every failure of a handler is the notice's, retried or given up
        logger.debug("notice %s (%s) failed: %s", notice.pk, notice.handler, exc, exc_info=exc)
        return exc
    finally:
        if tidy:
            # A handler's queries ran on this thread's connection: tidied as a request's would be.
            close_old_connections()
    return None


def _objects_of(notices: Sequence[Notice]) -> dict[tuple[str, str], Any]:
    """The objects the notices are about, one query per model (as they are now)."""
    wanted: dict[str, set[str]] = {}
    for notice in notices:
        if notice.object_model:
            wanted.setdefault(notice.object_model, set()).add(notice.object_id)
    found: dict[tuple[str, str], Any] = {}
    for label, ids in wanted.items():
        try:
            model = apps.get_model(label)
        except (LookupError, ValueError):
            continue
        pk = model._meta.pk
        rows = model._base_manager.filter(pk__in=[pk.to_python(object_id) for object_id in ids])
        found.update({(label, str(row.pk)): row for row in rows})
    return found


def _no_longer_wanted(notices: Sequence[Notice]) -> list[Any]:
    """The notices whose handler asks its object to still meet ``pending``, and whose object does not."""
    by_handler: dict[str, list[Notice]] = {}
    for notice in notices:
        by_handler.setdefault(notice.handler, []).append(notice)
    dropped: list[Any] = []
    for name, group in by_handler.items():
        try:
            handler = handlers.get(name)
        except LookupError:
            continue  # delivered, and failing there: a handler that is no longer declared is the notice's error
        if handler.pending is None or handler.model is None:
            continue
        pk = handler.model._meta.pk
        meeting = {str(row) for row in handler.model._base_manager.filter(
            handler.pending, pk__in=[pk.to_python(notice.object_id) for notice in group if notice.object_id]
        ).values_list("pk", flat=True)}
        dropped += [notice.pk for notice in group if notice.object_id not in meeting]
    return dropped
