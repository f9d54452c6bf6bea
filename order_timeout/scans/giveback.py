"""Give back the time a pause took: deadlines that fell inside it move later by its length, once.

Resuming a timer staff paused during an outage (a payment provider down), ``--give-back`` moves
every pending row whose deadline fell inside the pause, or falls within ``GIVE_BACK_GRACE``
after the resume, later by the pause's length: the customer who could not pay for an hour gets
that hour. It runs while the timer is still paused (nothing of it is acted on meanwhile), a
chunk of ``COMPENSATION_CHUNK`` rows per transaction, in the order of their keys: the rows are
locked with ``SKIP LOCKED`` (nobody waits on a give-back; a row locked elsewhere, a payment being
confirmed, is tried again after the walk), their deadlines moved by one ``UPDATE``, and the key
reached is written in the pause in the same transaction, so a give-back cut short (its process
killed) goes on from there and no row moves twice. The length is fixed at the first try and
kept in the pause. Redis follows as for any extension: a member waits at its old score, and the
first look at it, after the resume, finds its row not due and puts it back at its new deadline
(a reminder at its new moment); a member Redis lost is put back at its new deadline.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from datetime import datetime, timedelta
from typing import Any

from django.db import models, router, transaction
from django.db.models import F

from ..conf import settings
from ..db.session import database_now, limit_transaction
from ..models import Deadline, Pause
from ..queue import TimeoutQueue
from ..timers.closes import OnOrderModel
from ..timers.deadlines import ColumnDeadlines, OutsideDeadlines
from ..timers.kind import Kind
from ..timers.pausing import PauseRefused, kind_named, open_pauses, resume
from ..timers.registry import REMINDERS

logger = logging.getLogger("order_timeout")

# A row locked elsewhere when its chunk came is tried again this often, a pause apart.
BUSY_ROUNDS = 10
BUSY_PAUSE = 0.5


@dataclass
class GiveBack:
    """What a give-back did."""

    seconds: float = 0.0
    # The window of deadlines moved: [since, until).
    since: datetime | None = None
    until: datetime | None = None
    moved: int = 0
    # Rows still locked elsewhere after every round: not given back (likely being paid).
    busy: int = 0

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def can_give_back(kind: Kind) -> None:
    """``PauseRefused`` naming the kind when it has no deadline of its own the app can write."""
    if kind.label in (REMINDERS.label, "notices") or not isinstance(kind.deadlines, (ColumnDeadlines,
                                                                                     OutsideDeadlines)):
        raise PauseRefused(f"{kind.label} has no deadline of its own to give time back to: "
                           + ("its reminders follow their orders' deadlines; give back to close."
                              if kind.label == REMINDERS.label else "resume it without --give-back."))


def resume_timers(names: Sequence[str], *, give_time_back: bool, user: Any = None,
                  now: datetime | None = None) -> tuple[list[Pause], dict[str, GiveBack]]:
    """Resume the paused timers ``names``, each first given its time back when ``give_time_back``
    (while still paused): what ``order_timeout_resume`` and the admin's form both do. Every
    give-back is refused (``PauseRefused``) before any deadline moves. ``now``: the database's clock,
    as the pause's start was stamped."""
    now = now or database_now(router.db_for_write(Pause))
    given: dict[str, GiveBack] = {}
    if give_time_back:
        paused = open_pauses()
        for name in names:
            if name in paused:
                can_give_back(kind_named(name))

    def giving_back(pause: Pause) -> None:
        given[pause.timer] = give_back(kind_named(pause.timer), pause, resume_at=now)

    ended = resume(names, user=user, now=now, before_resuming=giving_back if give_time_back else None)
    return ended, given


def give_back(kind: Kind, pause: Pause, *, resume_at: datetime, grace: float | None = None,
              chunk: int | None = None) -> GiveBack:
    """Move the deadlines of ``kind``'s pending rows inside the pause (and ``grace`` after
    ``resume_at``) later by the pause's length; the timer must still be paused."""
    can_give_back(kind)
    grace = settings.GIVE_BACK_GRACE if grace is None else grace
    chunk = chunk or settings.COMPENSATION_CHUNK
    if transaction.get_connection(kind.using).in_atomic_block:
        # Its chunks would be savepoints of one transaction holding every row it moved till the end.
        raise PauseRefused(f"{kind.label}'s time is given back a transaction per chunk: run it outside a "
                           "transaction (a view under ATOMIC_REQUESTS needs @transaction.non_atomic_requests).")
    if pause.given_back_seconds is None:
        # Fixed at the first try (by whichever of two staff comes first): a give-back cut short
        # goes on with the same length.
        Pause.objects.filter(pk=pause.pk, given_back_seconds__isnull=True).update(
            given_back_seconds=max((resume_at - pause.paused_at).total_seconds(), 0.0))
        pause.refresh_from_db(fields=["given_back_seconds", "give_back_after"])
    seconds = pause.given_back_seconds
    assert seconds is not None
    result = GiveBack(seconds=seconds, since=pause.paused_at, until=resume_at + timedelta(seconds=grace))
    walk = _Walk(kind, pause, result, timedelta(seconds=seconds), chunk)
    walk.run()
    logger.info("%s: gave %gs back to %d row(s) due from %s to %s%s.", kind.label, seconds, result.moved,
                result.since, result.until, f" ({result.busy} locked elsewhere, not moved)" if result.busy else "")
    return result


class _Walk:
    """The rows of one kind in the window, in key order after the pause's ``give_back_after``."""

    def __init__(self, kind: Kind, pause: Pause, result: GiveBack, by: timedelta, chunk: int) -> None:
        self.kind, self.pause, self.result, self.by, self.chunk = kind, pause, result, by, chunk
        self.using = kind.using
        store = kind.deadlines
        self.outside = isinstance(store, OutsideDeadlines)
        self.field = store.field if isinstance(store, ColumnDeadlines) else "expires_at"

    def rows(self) -> models.QuerySet[Any]:
        """The kind's pending rows' keys and deadlines in the window (the app's table, or the model's)."""
        window = {f"{self.field}__gte": self.result.since, f"{self.field}__lt": self.result.until}
        if self.outside:
            return Deadline.objects.using(self.using).filter(timer=self.kind.name, **window)
        return self.kind.model._base_manager.db_manager(self.using).filter(self.kind.pending, **window)

    def key_of(self, text: str) -> Any:
        model = Deadline if self.outside else self.kind.model
        return model._meta.pk.to_python(text)

    def run(self) -> None:
        busy: list[Any] = []
        after = self.pause.give_back_after
        # The progress this walk last saw in the pause: another give-back of it moved it, so stop.
        self.expected = after
        while True:
            page = self.rows().order_by("pk")
            if after:
                page = page.filter(pk__gt=self.key_of(after))
            keys = list(page.values_list("pk", flat=True)[:self.chunk])
            if not keys:
                break
            busy += self._chunk(keys, last=keys[-1])
            after = str(keys[-1])
        for _round in range(BUSY_ROUNDS):
            if not busy:
                return
            time.sleep(BUSY_PAUSE)
            busy = self._chunk(busy, last=None)
        self.result.busy = len(busy)
        if busy:
            logger.warning("%s: %d row(s) stayed locked elsewhere through the give-back (a payment being "
                           "confirmed?): their deadlines were not moved: %s", self.kind.label, len(busy),
                           ", ".join(map(str, busy[:20])))

    def _chunk(self, keys: list[Any], *, last: Any) -> list[Any]:
        """Move what of ``keys`` is still in the window (locked, skipping rows locked elsewhere);
        write ``last`` as the pause's progress in the same transaction. The keys skipped."""
        with transaction.atomic(using=self.using), transaction.atomic(using=router.db_for_write(Pause)):
            limit_transaction(self.using)
            self._hold_the_pause(last)
            locked = list(self.rows().filter(pk__in=keys).select_for_update(skip_locked=True)
                          .values_list("pk", "object_id" if self.outside else "pk"))
            if self.outside and locked:
                # The shop's rows too, as an act and a set_deadline() lock them; one locked elsewhere
                # (a payment) is skipped as its deadline row would be, never waited on: a payment
                # that locks its row and then its deadline's would deadlock with a wait here.
                rows = self.kind.model._base_manager.db_manager(self.using)
                to_key = self.kind.model._meta.pk.to_python
                held = {str(pk) for pk in rows.filter(pk__in=[to_key(object_id) for _pk, object_id in locked])
                        .select_for_update(skip_locked=True).values_list("pk", flat=True)}
                locked = [(pk, object_id) for pk, object_id in locked if str(to_key(object_id)) in held]
            moved = [pk for pk, _row in locked]
            if moved:
                self.rows().filter(pk__in=moved).update(**{self.field: F(self.field) + self.by})
            progress: dict[str, Any] = {"given_back_rows": F("given_back_rows") + len(moved)}
            if last is not None:
                progress["give_back_after"] = str(last)
            Pause.objects.filter(pk=self.pause.pk).update(**progress)
        self.result.moved += len(moved)
        if last is not None:
            self.expected = str(last)
        self._follow([row for _pk, row in locked])
        taken = {pk for pk, _row in locked}
        still = set(self.rows().filter(pk__in=[key for key in keys if key not in taken]).values_list("pk", flat=True))
        return [key for key in keys if key in still]

    def _hold_the_pause(self, last: Any) -> None:
        """Lock the pause for this chunk's transaction, and stop (``PauseRefused``) when it was resumed
        or another give-back of it moved its progress since this walk last wrote it: two staff
        giving the same time back at once move each row once, the first one's walk going on."""
        stored = (Pause.objects.using(router.db_for_write(Pause)).select_for_update().filter(pk=self.pause.pk)
                  .values_list("give_back_after", "resumed_at").first())
        if stored is None or stored[1] is not None:
            raise PauseRefused(f"{self.kind.label} was resumed meanwhile: its give-back stopped.")
        if last is not None and stored[0] != self.expected:
            raise PauseRefused(f"{self.kind.label}'s time is being given back by someone else: this give-back "
                               "stopped, and no row was moved twice.")

    def _follow(self, rows: list[Any]) -> None:
        """Members Redis lost come back at their new deadlines (and the reminders at their moments);
        those it holds wait at their old scores for the first look after the resume."""
        if not rows:
            return
        keys = [self.kind.model._meta.pk.to_python(row) for row in rows] if self.outside else rows
        deadlines = self.kind.deadlines
        if self.outside:
            found = dict(Deadline.objects.using(self.using).filter(
                timer=self.kind.name, object_id__in=[str(key) for key in keys]).values_list("object_id", "expires_at"))
            pairs = [(key, found[str(key)]) for key in keys if str(key) in found]
        else:
            assert isinstance(deadlines, ColumnDeadlines)
            pairs = list(self.kind.model._base_manager.db_manager(self.using).filter(pk__in=keys)
                         .values_list("pk", deadlines.field))
        queue = TimeoutQueue.from_settings()
        try:
            queue.of_kind(self.kind.key_space).schedule(self.kind.scores(pairs), only_missing=True)
            if isinstance(self.kind, OnOrderModel) and settings.REMINDERS:
                queue.of_kind(REMINDERS.key_space).schedule(type(REMINDERS)(self.kind.model).scores(pairs),
                                                            only_missing=True)
        except Exception as error:  # noqa: BLE001 - the deadlines moved: the scan puts back what Redis lost
            logger.warning("%s: could not put back in Redis the members it lacked after the give-back (%s); "
                           "the compensation scan does.", self.kind.label, error)
