"""Give deadlines to unpaid rows that have none: the last step of adopting the app on old orders.

Rows keep ``expires_at`` NULL after the migration, so nothing is scheduled or
closed behind the shop's back. ``plan()`` says what a backfill would do;
``run()`` does it in chunks, each chunk committed and then scheduled.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from datetime import datetime, timedelta
from typing import Any

from django.core.exceptions import FieldDoesNotExist
from django.db import models, router, transaction
from django.db.models import F, Max, Min
from django.utils import timezone

from .. import get_order_model
from ..conf import settings
from ..models import TimeoutOrderMixin
from ..scheduling import schedule


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
                 now: datetime | None = None, chunk_size: int | None = None) -> None:
        if (in_seconds is None) == (from_field is None):
            raise ValueError("give either in_seconds or from_field")
        self.model = model or get_order_model()
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
        return plan
