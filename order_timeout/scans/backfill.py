"""Give deadlines to unpaid rows that have none: the last step of adopting the app on old orders.

Rows keep ``expires_at`` NULL after the migration, so nothing is scheduled or
closed behind the shop's back. ``plan()`` says what a backfill would do;
``run()`` does it in chunks, each chunk committed and then scheduled.

A declared timer whose deadline is a column has its deadlines already, but
rows pending before it was declared (or written by ``bulk_create()`` and
``update()``, which send no signals) have no member in Redis: ``TimerBackfill``
puts them in, the overdue ones due now, the others at their deadlines.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from django.core.exceptions import FieldDoesNotExist
from django.db import models, router, transaction
from django.db.models import F, Max, Min
from django.utils import timezone

from ..conf import settings
from ..db.primary import on_primary
from ..models import DeadLetter, TimeoutOrderMixin
from ..ordermodel import get_order_model
from ..queue import TimeoutQueue
from ..scheduling import schedule
from ..timers.kind import Kind
from . import walks

if TYPE_CHECKING:
    from .compensation import Progress


@dataclass
class BackfillPlan:
    # Unpaid rows without a deadline.
    candidates: int
    # Of those, how many get one (rows whose source field is empty are left alone).
    dated: int
    # Deadlines already past: the consumer closes these as soon as they are scheduled.
    overdue_at_once: int
    earliest: datetime | None
    latest: datetime | None
    # Rows given a deadline (0 for a plan that was only looked at).
    done: int = 0

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


class Backfill:
    """Deadlines ``now + in_seconds`` for every row, or the row's own ``from_field`` + ``timeout``."""

    def __init__(self, *, in_seconds: float | None = None, from_field: str | None = None,
                 timeout: float | None = None, model: type[TimeoutOrderMixin] | None = None,
                 now: datetime | None = None, chunk_size: int | None = None,
                 progress: Progress | None = None) -> None:
        if (in_seconds is None) == (from_field is None):
            raise ValueError("give either in_seconds or from_field")
        self.model = model or get_order_model()
        self.progress = progress
        self.now = now or timezone.now()
        self.chunk_size = chunk_size or settings.COMPENSATION_CHUNK
        self.from_field = from_field
        if from_field is not None:
            try:
                field = self.model._meta.get_field(from_field)
            except FieldDoesNotExist:
                raise ValueError(f"{self.model._meta.label} has no field {from_field!r}") from None
            if not isinstance(field, models.DateTimeField):
                raise ValueError(f"{self.model._meta.label}.{from_field} is not a DateTimeField")
        self.offset = timedelta(seconds=settings.DEFAULT_TIMEOUT if timeout is None else timeout)
        self.in_seconds = in_seconds

    def _candidates(self) -> models.QuerySet[Any]:
        manager = self.model._base_manager.db_manager(router.db_for_write(self.model))
        return manager.filter(self.model.unpaid_q(), expires_at__isnull=True)

    def _dated(self) -> models.QuerySet[Any]:
        rows = self._candidates()
        return rows.filter(**{f"{self.from_field}__isnull": False}) if self.from_field else rows

    def _deadline(self) -> Any:
        if self.from_field:
            return F(self.from_field) + self.offset
        assert self.in_seconds is not None
        return self.now + timedelta(seconds=self.in_seconds)

    def plan(self) -> BackfillPlan:
        dated = self._dated()
        if self.from_field:
            bounds = dated.aggregate(first=Min(self.from_field), last=Max(self.from_field))
            earliest = bounds["first"] and bounds["first"] + self.offset
            latest = bounds["last"] and bounds["last"] + self.offset
            overdue = dated.filter(**{f"{self.from_field}__lte": self.now - self.offset}).count()
        else:
            earliest = latest = self._deadline() if dated.exists() else None
            overdue = 0
        return BackfillPlan(candidates=self._candidates().count(), dated=dated.count(),
                            overdue_at_once=overdue, earliest=earliest, latest=latest)

    def run(self) -> BackfillPlan:
        plan = self.plan()
        dated = self._dated().order_by("pk")
        using = router.db_for_write(self.model)
        while True:
            with transaction.atomic(using=using):
                pks = list(dated.select_for_update().values_list("pk", flat=True)[:self.chunk_size])
                if not pks:
                    break
                self.model._base_manager.db_manager(using).filter(pk__in=pks).update(
                    expires_at=self._deadline())
                # Scheduled once this chunk commits, like any save.
                schedule(self.model._base_manager.db_manager(using).filter(pk__in=pks).only(
                    "pk", self.model.TIMEOUT_STATUS_FIELD, "expires_at"))
            plan.done += len(pks)
            if self.progress:
                self.progress(plan.done, max(plan.dated, plan.done))
        return plan


# A deadline at ``now`` itself is due: the walk of the due rows ends just after it (both
# databases keep a DateTimeField to the microsecond).
_TICK = timedelta(microseconds=1)


@dataclass
class TimerBackfillPlan:
    """What scheduling a column timer's pending rows found (``dry_run``: would do)."""

    timer: str
    # Pending rows with a deadline; of them, past it (due now) and ahead of it.
    examined: int = 0
    due: int = 0
    future: int = 0
    # Put in Redis, which held no member for them (with dry_run: would be).
    scheduled: int = 0
    # Of those, past their deadline: the consumer acts on them at once.
    overdue_at_once: int = 0
    # Held in Redis at a later score than their deadline: moved to it (a member only moves earlier).
    moved_earlier: int = 0
    # Held in Redis and left as they are: no later than their deadline, leased to a consumer, or
    # due and waiting for a retry or a hold's next look (pulled forward, a retry's backoff is lost).
    kept: int = 0
    # An open dead letter waits for staff: left to them, never put back behind their backs.
    dead_letters: int = 0
    dry_run: bool = False

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


class TimerBackfill:
    """Put a column timer's pending rows in its queue: those past their deadline due now, the others
    at their deadlines; ``plan()`` says what ``run()`` would do. Only Redis changes: the rows carry
    their deadlines already."""

    def __init__(self, timer: Kind, *, queue: TimeoutQueue | None = None, now: datetime | None = None,
                 chunk_size: int | None = None, progress: Progress | None = None) -> None:
        if timer.deadline is None:
            raise ValueError(
                f"{timer!r} keeps its deadlines in the app's table (deadline = None), not in a column: "
                "set_deadline() gives a row its deadline and schedules it, and "
                f"order_timeout_redate --timer {timer.name} asks deadline_for() again for every pending row.")
        self.timer = timer
        self.queue = (queue or TimeoutQueue.from_settings()).of_kind(timer.key_space)
        self.now = now or timezone.now()
        self.chunk_size = chunk_size or settings.COMPENSATION_CHUNK
        self.progress = progress

    def plan(self) -> TimerBackfillPlan:
        return self._walk(dry_run=True)

    def run(self) -> TimerBackfillPlan:
        return self._walk(dry_run=False)

    def _walk(self, *, dry_run: bool) -> TimerBackfillPlan:
        plan = TimerBackfillPlan(timer=self.timer.name, dry_run=dry_run)
        due_before = self.now + _TICK
        # Counted once, for the bar only.
        total = (walks.count(self.timer, before=due_before) + walks.count(self.timer, after=self.now)
                 if self.progress else 0)
        both = ((True, walks.overdue(self.timer, due_before, self.chunk_size)),
                (False, walks.upcoming(self.timer, self.now, None, self.chunk_size)))
        for due, chunks in both:
            for rows in chunks:
                self._schedule(rows, plan, due=due, dry_run=dry_run)
                if self.progress:
                    self.progress(plan.examined, max(total, plan.examined))
        return plan

    def _schedule(self, rows: list[tuple[Any, datetime]], plan: TimerBackfillPlan, *, due: bool,
                  dry_run: bool) -> None:
        plan.examined += len(rows)
        if due:
            plan.due += len(rows)
        else:
            plan.future += len(rows)
        buried = set(on_primary(DeadLetter).filter(
            order_model=self.timer.model._meta.label, timer=self.timer.name, resolved_at__isnull=True,
            order_id__in=[str(pk) for pk, _ in rows]).values_list("order_id", flat=True))
        scores = self.timer.scores([(pk, at) for pk, at in rows if str(pk) not in buried])
        plan.dead_letters += len(rows) - len(scores)
        missing: dict[str, int] = {}
        earlier: dict[str, int] = {}
        for member, where in self.queue.positions(scores).items():
            score = scores[member]
            if where.lease_ms is not None:
                plan.kept += 1  # a consumer has it in hand: it acks it or puts it back itself
            elif where.unreadable:
                earlier[member] = score  # a score no deadline can have: lowered to the row's
                plan.scheduled += 1
                plan.overdue_at_once += due
            elif where.pending_ms is None:
                missing[member] = score
            elif due or where.pending_ms <= score:
                plan.kept += 1
            else:
                earlier[member] = score
                plan.moved_earlier += 1
        if dry_run:
            added = len(missing)
        else:
            # NX for the missing: one that came back since positions() (a save, a consumer's retry)
            # keeps its score. LT for the others: only ever earlier (schedule.lua).
            added = self.queue.schedule(missing, only_missing=True) if missing else 0
            if earlier:
                self.queue.schedule(earlier)
        plan.scheduled += added
        plan.overdue_at_once += added if due else 0
        plan.kept += len(missing) - added
