"""Re-date open orders from ``DEADLINE_POLICY``: after a payment window changed, or to adopt the app.

A deadline is stored once per row, when the order is saved; a policy that
changes later (a channel's window made longer) reaches new orders only. A
re-date asks the policy again for each unpaid order (all, or those ``where``
names) and writes the answers, a chunk per transaction: the chunk's rows are
locked with ``SKIP LOCKED`` (a row another transaction holds, a payment being
confirmed, a consumer closing it, is left alone and counted as busy: nobody
waits on a re-date, and a re-date waits on nobody), the changed deadlines are
written in one ``UPDATE``, and Redis follows once the chunk commits, as for
any save. ``undated=True`` gives the rows without a deadline one instead: the
backfill by policy.

A row with an open dead letter is left to staff, and so is a row the policy
fails for (it raises, or answers no deadline): counted, never given a default.
"""

from __future__ import annotations

import logging
from dataclasses import asdict, dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any

from django.core.exceptions import FieldError, ImproperlyConfigured
from django.db import router, transaction
from django.db.models import Q
from django.utils import timezone

from ..conf import settings
from ..db.locks import LockedOrders
from ..db.primary import on_primary
from ..models import DeadLetter, PolicyFailed, TimeoutOrderMixin, policy_answer
from ..ordermodel import get_order_model
from ..redaction import one_line
from ..scheduling import schedule
from ..timers.deadlines import OutsideDeadlines
from ..timers.kind import Kind
from ..timers.registry import ORDER_TIMEOUT

if TYPE_CHECKING:
    from .compensation import Progress

logger = logging.getLogger("order_timeout")


@dataclass
class RedatePlan:
    """What a re-date found (``dry_run``: would do), row by row."""

    # Unpaid rows the re-date looked at (those ``where`` names, with or without a deadline).
    examined: int = 0
    # Their deadline moves: later, earlier, or away (the policy says it never expires).
    later: int = 0
    earlier: int = 0
    never: int = 0
    # Given a deadline that had none (``undated``).
    dated: int = 0
    unchanged: int = 0
    # Of the moved and dated, deadlines already past: closed as soon as they are scheduled.
    overdue_at_once: int = 0
    # Locked by another transaction when their chunk came: left as they were (run it again).
    busy: int = 0
    # An open dead letter waits for staff: left to them.
    dead_letters: int = 0
    # The policy raised or answered no deadline for them: left as they were, logged.
    failed: int = 0
    earliest: datetime | None = None
    latest: datetime | None = None
    dry_run: bool = False
    failures: list[str] = field(default_factory=list)

    @property
    def changed(self) -> int:
        return self.later + self.earlier + self.never + self.dated

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "changed": self.changed}

    def _count(self, old: datetime | None, new: datetime | None, now: datetime) -> bool:
        """Count one row's change; whether it changes."""
        if new == old:
            self.unchanged += 1
            return False
        if new is None:
            self.never += 1
        elif old is None:
            self.dated += 1
        elif new > old:
            self.later += 1
        else:
            self.earlier += 1
        if new is not None:
            self.overdue_at_once += new <= now
            self.earliest = new if self.earliest is None else min(self.earliest, new)
            self.latest = new if self.latest is None else max(self.latest, new)
        return True


# The failures a plan keeps word for word (the rest are counted, and each is logged).
KEPT_FAILURES = 10


class Redate:
    """Ask ``DEADLINE_POLICY`` again for the unpaid orders ``where`` names (every one by default);
    with ``timer``, ask a declared timer's ``deadline_for`` for its pending rows."""

    def __init__(self, *, where: Q | None = None, undated: bool = False,
                 model: type[TimeoutOrderMixin] | None = None, chunk_size: int | None = None,
                 timer: Kind | None = None, progress: Progress | None = None) -> None:
        self.timer = timer
        self.progress = progress
        if timer is not None:
            if type(timer).deadline_for is Kind.deadline_for:
                raise ImproperlyConfigured(f"{timer!r} declares no deadline_for(): there is nothing to re-date "
                                           "its rows from.")
            self.model = timer.model
            rows = timer.model._base_manager.db_manager(timer.using).filter(timer.pending)
            if timer.deadline is not None:
                rows = rows.filter(**{f"{timer.deadline}__isnull": undated})
        else:
            if settings.DEADLINE_POLICY is None:
                raise ImproperlyConfigured("ORDER_TIMEOUT['DEADLINE_POLICY'] is not set: there is no policy to "
                                           "re-date orders from.")
            self.model = model or get_order_model()
            rows = self.model._base_manager.db_manager(router.db_for_write(self.model)).filter(
                self.model.unpaid_q(), expires_at__isnull=undated)
        self.using = router.db_for_write(self.model)
        self.chunk_size = chunk_size or settings.COMPENSATION_CHUNK
        self.undated = undated
        try:
            self.rows = rows.filter(where) if where is not None else rows
            str(self.rows.query)  # a lookup that does not fit the model fails here, not mid-run
        except (FieldError, ValueError, TypeError) as exc:
            raise ValueError(f"the filter does not fit {self.model._meta.label}: {exc}") from exc

    def plan(self) -> RedatePlan:
        """What ``run`` would do, read without a lock."""
        return self._walk(dry_run=True)

    def run(self) -> RedatePlan:
        return self._walk(dry_run=False)

    def _walk(self, *, dry_run: bool) -> RedatePlan:
        plan = RedatePlan(dry_run=dry_run)
        # Counted once, for the bar only: rows that change meanwhile move the end, not the walk.
        total = self.rows.count() if self.progress else 0
        last = None
        while True:
            page = self.rows.order_by("pk")
            if last is not None:
                page = page.filter(pk__gt=last)
            pks = list(page.values_list("pk", flat=True)[:self.chunk_size])
            if not pks:
                return plan
            last = pks[-1]
            if dry_run:
                self._redate(pks, plan, lock=False)
            else:
                with transaction.atomic(using=self.using):
                    self._redate(pks, plan, lock=True)
            if self.progress:
                self.progress(plan.examined, max(total, plan.examined))

    def _redate(self, pks: list[Any], plan: RedatePlan, *, lock: bool) -> None:
        rows = self.rows.filter(pk__in=pks).order_by("pk")
        if lock:
            # A bounded lock: rows locked elsewhere are skipped, never waited for.
            rows = rows.select_for_update(skip_locked=True)
        found = list(rows)
        plan.examined += len(pks)
        plan.busy += len(pks) - len(found)
        name = ORDER_TIMEOUT.name if self.timer is None else self.timer.name
        buried = set(on_primary(DeadLetter).filter(order_model=self.model._meta.label, timer=name,
                                                   resolved_at__isnull=True, order_id__in=[str(pk) for pk in pks])
                     .values_list("order_id", flat=True))
        current = self._current(found)
        now = timezone.now()
        changed = []
        for row in found:
            if str(row.pk) in buried:
                plan.dead_letters += 1
                continue
            try:
                deadline = self._answer(row)
            except PolicyFailed as exc:
                plan.failed += 1
                if len(plan.failures) < KEPT_FAILURES:
                    plan.failures.append(str(exc))
                # An expected failure (a policy that raises for some orders): one line saying why, the
                # policy's traceback at DEBUG (docs/operations.md, "Log lines to alert on").
                logger.warning("re-date: %s; its deadline is left as it was.", _why(exc))
                logger.debug("re-date: %s", exc, exc_info=exc.__cause__)
                continue
            old = current.get(row.pk)
            if deadline is None and self.undated:
                plan.unchanged += 1  # no deadline, and none to give: nothing changes
                continue
            if plan._count(old, deadline, now):
                changed.append((row, deadline))
        if changed and lock:
            self._write(changed)

    def _current(self, rows: list[Any]) -> dict[Any, datetime | None]:
        """Each row's deadline now."""
        if self.timer is None:
            return {row.pk: row.expires_at for row in rows}
        if self.timer.deadline is not None:
            return {row.pk: getattr(row, self.timer.deadline) for row in rows}
        return self.timer.deadlines.read(None, LockedOrders(rows={row.pk: row for row in rows}))

    def _answer(self, row: Any) -> datetime | None:
        """What the policy (or the timer's ``deadline_for``) says now; ``PolicyFailed`` when it fails."""
        if self.timer is None:
            return policy_answer(row)
        try:
            deadline = self.timer.deadline_for(row)
        except Exception as exc:
            raise PolicyFailed(f"{self.timer!r}.deadline_for raised for {self.model.__name__} {row.pk!r}") from exc
        if deadline is None or (isinstance(deadline, datetime) and timezone.is_aware(deadline)):
            return deadline
        raise PolicyFailed(f"{self.timer!r}.deadline_for answered {deadline!r} for {self.model.__name__} "
                           f"{row.pk!r}, not an aware datetime or None")

    def _write(self, changed: list[tuple[Any, datetime | None]]) -> None:
        """The new deadlines, and Redis told once the chunk commits (a row that never expires leaves it)."""
        manager = self.model._base_manager.db_manager(self.using)
        if self.timer is None or self.timer.deadline is not None:
            field: str = "expires_at" if self.timer is None else str(self.timer.deadline)
            for row, deadline in changed:
                setattr(row, field, deadline)
            manager.bulk_update([row for row, _ in changed], [field])
            rows = [row for row, _ in changed]
            if self.timer is None:
                schedule(rows)
            else:
                self.timer.schedule(rows)
            return
        store = self.timer.deadlines
        assert isinstance(store, OutsideDeadlines)
        for row, deadline in changed:
            if deadline is None:
                store.drop(row)
            else:
                store.put(row, deadline)


def rows_filter(pairs: list[str]) -> Q | None:
    """``["channel__slug=web", "payment_method__in=card,wallet"]`` as one ``Q`` (None for none).

    ``ValueError`` for a pair without ``=``. Values are strings (Django converts them for their
    field); ``__in`` splits on commas, ``__isnull`` reads true/false.
    """
    condition = Q()
    for pair in pairs:
        lookup, sep, value = pair.partition("=")
        if not sep or not lookup:
            raise ValueError(f"{pair!r} is not LOOKUP=VALUE (e.g. channel__slug=web)")
        parsed: Any = value
        if lookup.endswith("__in"):
            parsed = [part for part in value.split(",") if part]
        elif lookup.endswith("__isnull"):
            if value.lower() not in ("true", "false"):
                raise ValueError(f"{pair!r}: __isnull takes true or false")
            parsed = value.lower() == "true"
        condition &= Q(**{lookup: parsed})
    return condition if pairs else None


def _why(failed: PolicyFailed) -> str:
    """The failure on one line, with the error the policy raised (its type and text), if it raised."""
    cause = failed.__cause__
    return one_line(failed if cause is None else f"{failed} ({type(cause).__name__}: {cause})")
