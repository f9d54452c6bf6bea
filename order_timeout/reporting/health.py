"""How the timeouts are doing, computed once for every face that shows it.

The status command, and anything else that reports on the queue, render a
``Health``; none computes its own figures.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields
from datetime import datetime
from typing import Any

from django.db import router
from django.utils import timezone

from ..conf import settings
from ..models import DeadLetter, TimeoutOrderMixin
from ..ordermodel import get_order_model
from ..queue import QueueStats, TimeoutQueue
from ..queue.keys import REMIND
from ..scans import walks
from ..scans.refusals import still_waiting
from ..timers.closes import OrderTimeout
from ..timers.kind import Kind
from ..timers.members import now_score
from ..timers.registry import ORDER_TIMEOUT, registry


@dataclass(frozen=True)
class Backlog:
    """What one kind's queue holds, as Redis says: the same figures for every kind."""

    pending: int
    due_unclaimed: int
    leased: int
    # Leases that ran out: their consumer died; they wait for the next claim.
    expired_leases: int
    # How long the oldest due member (or expired lease) has waited to be claimed.
    oldest_due_age_seconds: float
    # Members whose row another transaction kept locked when a consumer came for it,
    # and how long the longest such lock has kept one waiting.
    busy: int
    oldest_busy_age_seconds: float
    # Members taken over from a consumer that died, froze or overran its lease with them.
    taken_over: int
    # Due members held by their hold condition (a payment in flight), and how long the
    # longest-held has been.
    held: int
    oldest_held_age_seconds: float

    @staticmethod
    def of(stats: QueueStats, now: datetime) -> dict[str, Any]:
        """The figures of ``stats``, as keyword arguments."""
        return {"pending": stats.pending, "due_unclaimed": stats.due, "leased": stats.leased,
                "expired_leases": stats.expired_leases, "oldest_due_age_seconds": _age(now, stats.oldest_due_ms),
                "busy": stats.busy, "oldest_busy_age_seconds": _age(now, stats.oldest_busy_ms),
                "taken_over": stats.taken_over, "held": stats.held,
                "oldest_held_age_seconds": _age(now, stats.oldest_held_ms)}


@dataclass(frozen=True)
class Health(Backlog):
    """The order close's figures (and its reminders'), and each declared timer's in ``timers``."""

    # Open dead letters: orders waiting for staff.
    dead_letters: int
    # Unpaid rows past their deadline, whatever Redis says (less those the hold
    # condition holds within MAX_HOLD: they are not overdue, they wait for their payment,
    # and those SETTLED_CONDITION settles: they are paid by another column).
    overdue_unpaid_in_database: int
    # Unpaid rows with no deadline: never scheduled, never scanned.
    unpaid_without_deadline: int
    # Unpaid rows with a deadline that Redis does not hold (and no open dead
    # letter): lost writes, or bulk changes nobody scheduled. None: not counted.
    drift: int | None
    # Reminders (ORDER_TIMEOUT["REMINDERS"]) waiting for their moment, and past it not claimed yet.
    reminders_pending: int = 0
    reminders_due: int = 0
    # Members moved out of the queue because they name no order (not UTF-8, malformed, scored
    # past any deadline): for a person to look at (nothing else reads them).
    quarantined: int = 0
    # Rows unpaid by their status that SETTLED_CONDITION settles: paid by another column, never
    # closed (Saleor's "unconfirmed" order fully charged, waiting for staff to confirm it).
    settled_unpaid: int = 0
    # Unpaid rows past their deadline that HOLD_CONDITION holds, within MAX_HOLD: waiting for
    # their payment, not late (past MAX_HOLD they count as overdue).
    held_in_database: int = 0
    # Writes the app refused over a deadline's act (a payment after its order closed, a stale
    # save), every timer's, not handled by staff yet: money may wait to be refunded.
    refused_writes: int = 0
    # Each timer a shop declared, by name: its own backlog (``TimerHealth``).
    timers: dict[str, TimerHealth] = field(default_factory=dict)
    # False when ORDER_MODEL is None: no order close, its figures neither read nor shown.
    closes_orders: bool = True

    def as_dict(self) -> dict[str, Any]:
        """Every figure; with no order close, only the timers' and the app's own (and ``closes_orders``)."""
        figures = asdict(self)
        if not self.closes_orders:
            return {"closes_orders": False, "refused_writes": self.refused_writes, "timers": figures["timers"]}
        return figures

    @classmethod
    def of_timers(cls, timers: dict[str, TimerHealth], **app_figures: Any) -> Health:
        """The health of a project with no order close (ORDER_MODEL None): its timers only, and the
        figures of the app as a whole (``refused_writes``); the close's figures are 0."""
        zero: dict[str, Any] = {item.name: 0 for item in fields(cls)
                                if item.name not in ("timers", "closes_orders", "drift")}
        return cls(**{**zero, **app_figures}, drift=None, timers=timers, closes_orders=False)


@dataclass(frozen=True)
class TimerHealth(Backlog):
    """One declared timer's figures: the same as the order close's, in its own rows and keys."""

    dead_letters: int
    # Rows still pending past their deadline, whatever Redis says, less those its hold holds
    # within its longest hold (they wait for what holds them; past it they count here).
    overdue_in_database: int
    drift: int | None
    quarantined: int
    # Rows pending by their own columns that the timer's settled condition settles.
    settled: int = 0
    # Rows past their deadline that its hold holds, within its longest hold.
    held_in_database: int = 0


def measure(now: datetime | None = None, *, model: type[TimeoutOrderMixin] | None = None,
            queue: TimeoutQueue | None = None, drift: bool = True) -> Health:
    """Read Redis and the database; raises ``QueueUnavailable`` when Redis does not answer.

    ``drift`` walks every unpaid row with a deadline (in chunks): on a large
    table, count it every few minutes, not on every request.
    """
    now = now or timezone.now()
    queue = queue or TimeoutQueue.from_settings()
    timers = {timer.name: _timer(timer, queue.of_kind(timer.key_space), now, drift=drift)
              for timer in registry.reported()}
    if model is None and not settings.closes_orders():
        return Health.of_timers(timers, refused_writes=open_refused_writes())
    model = model or get_order_model()
    stats = queue.stats(now_score(now))
    rows = model._base_manager.db_manager(router.db_for_read(model)).filter(model.unpaid_q())
    # The close's own view of its rows (the hold within MAX_HOLD, the settled condition), on the primary.
    close = OrderTimeout(model)
    overdue, held = walks.overdue_and_held(close, now)
    return Health(
        **Backlog.of(stats, now),
        dead_letters=DeadLetter.objects.filter(timer=ORDER_TIMEOUT.name, resolved_at__isnull=True).count(),
        overdue_unpaid_in_database=overdue, held_in_database=held,
        unpaid_without_deadline=rows.filter(expires_at__isnull=True).count(),
        settled_unpaid=walks.settled_count(close),
        drift=count_drift(model, queue) if drift else None,
        **_reminders(queue, now, stats.quarantined),
        refused_writes=open_refused_writes(),
        timers=timers,
    )


def open_refused_writes() -> int:
    """Refused writes waiting for staff (along the ``handled_at`` index): a figure of the database
    alone, so a face can show it when Redis cannot be read. Not those whose rows reached what they
    tried since (the shop's own late payment went through): they settled by themselves."""
    return still_waiting()


def _timer(timer: Kind, queue: TimeoutQueue, now: datetime, *, drift: bool) -> TimerHealth:
    stats = queue.stats(now_score(now))
    overdue, held = walks.overdue_and_held(timer, now)
    return TimerHealth(
        **Backlog.of(stats, now),
        dead_letters=DeadLetter.objects.filter(timer=timer.name, resolved_at__isnull=True).count(),
        overdue_in_database=overdue, held_in_database=held, drift=count_drift(timer, queue) if drift else None,
        quarantined=stats.quarantined, settled=walks.settled_count(timer))


def _reminders(queue: TimeoutQueue, now: datetime, quarantined: int) -> dict[str, Any]:
    if not settings.REMINDERS:
        return {"quarantined": quarantined}
    stats = queue.of_kind(REMIND).stats(now_score(now))
    return {"reminders_pending": stats.pending, "reminders_due": stats.due,
            "quarantined": quarantined + stats.quarantined}


def _age(now: datetime, since_ms: int | None) -> float:
    return round((now_score(now) - since_ms) / 1000, 3) if since_ms is not None else 0.0


def count_drift(kind: Any, queue: TimeoutQueue) -> int:
    """Pending rows with a deadline (of the order model, or of a timer) whose member is neither
    pending nor leased.

    Members found missing are looked up once more at the end, so a row whose
    save was committing during the walk (its member on the way) is not
    counted; rows waiting as open dead letters left Redis on purpose.
    """
    kind = kind if isinstance(kind, Kind) else OrderTimeout(kind)
    missing: list[str] = []
    for chunk in walks.upcoming(kind, None, None, settings.COMPENSATION_CHUNK):
        missing += queue.missing(kind.member(pk) for pk, _ in chunk)
    if not missing:
        return 0
    buried = set(DeadLetter.objects.filter(order_model=kind.model._meta.label, timer=kind.name,
                                           resolved_at__isnull=True).values_list("order_id", flat=True))
    return len([member for member in queue.missing(missing) if member not in buried])
