"""Where a kind's deadlines live: a column of the model, or the app's own table.

A model the shop owns holds its deadline in a column (``expires_at``, or any
``DateTimeField`` a timer names). A model the shop cannot migrate (a
framework's, another system's table) keeps its deadlines in
``order_timeout.Deadline`` rows, one per timer and row, set with
``timer.set_deadline()``: the act still locks the shop's row, re-checks it
and updates it conditionally; its deadline row goes with the act.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any, Protocol

from django.db.models import Q

from ..db.walk import rows_by_deadline
from .owning import OwnsRows

if TYPE_CHECKING:
    from ..db.locks import LockedOrders

Rows = Iterator[list[tuple[Any, datetime]]]
# Keys looked up per query when the app's table is counted against the rows still pending.
_COUNT_CHUNK = 1000


class RowsOfATimer(OwnsRows, Protocol):
    """What the app's table of deadlines needs of the timer whose deadlines it keeps."""

    def schedule(self, rows: Any) -> None: ...

    def unschedule(self, rows: Any) -> None: ...


class DeadlineStore(Protocol):
    def read(self, manager: Any, locked: LockedOrders) -> dict[Any, datetime | None]:
        """The deadline of each locked row (read in the transaction that locked them)."""

    def of(self, row: Any) -> datetime | None:
        """A row's deadline as the row in hand says (for scheduling it after a save)."""

    def done(self, manager: Any, pks: Sequence[Any]) -> None:
        """The rows were acted on (or settled): their deadlines are spent."""

    def walk(self, rows: Any, chunk: int, *, before: datetime | None = None, after: datetime | None = None,
             until: datetime | None = None) -> Rows:
        """``(pk, deadline)`` of ``rows`` in deadline order, ``chunk`` at a time."""

    def count(self, rows: Any, *, before: datetime | None = None, after: datetime | None = None,
              until: datetime | None = None) -> int:
        """How many ``walk`` would yield."""

    def count_held(self, rows: Any, hold: Q, *, before: datetime, since: datetime | None) -> int:
        """How many of ``rows`` with a deadline before ``before`` (and after ``since``) meet ``hold``."""


def _meeting(rows: Any, condition: Q) -> Any:
    """``rows`` that meet ``condition``, as a subquery on the key: a condition over a related
    table must not repeat rows."""
    return rows.filter(pk__in=rows.model._base_manager.filter(condition).values("pk"))


class ColumnDeadlines:
    def __init__(self, field: str) -> None:
        self.field = field

    def read(self, manager: Any, locked: LockedOrders) -> dict[Any, datetime | None]:
        return locked.values(self.field)

    def of(self, row: Any) -> datetime | None:
        return getattr(row, self.field)

    def done(self, manager: Any, pks: Sequence[Any]) -> None:
        pass  # the act's UPDATE moved the row on: the re-check says so from now on

    def _within(self, rows: Any, before: datetime | None, after: datetime | None, until: datetime | None) -> Any:
        bounds = {f"{self.field}__lt": before, f"{self.field}__gt": after, f"{self.field}__lte": until}
        rows = rows.filter(**{lookup: value for lookup, value in bounds.items() if value is not None})
        return rows.exclude(**{f"{self.field}__isnull": True})

    def walk(self, rows: Any, chunk: int, *, before: datetime | None = None, after: datetime | None = None,
             until: datetime | None = None) -> Rows:
        return rows_by_deadline(self._within(rows, before, after, until), chunk, field=self.field)

    def count(self, rows: Any, *, before: datetime | None = None, after: datetime | None = None,
              until: datetime | None = None) -> int:
        return int(self._within(rows, before, after, until).count())

    def count_held(self, rows: Any, hold: Q, *, before: datetime, since: datetime | None) -> int:
        return int(_meeting(self._within(rows, before, since, None), hold).count())


class OutsideDeadlines:
    """Deadlines in ``order_timeout.Deadline``: ``(timer, object_id) -> expires_at``."""

    def __init__(self, timer: RowsOfATimer) -> None:
        self.timer = timer

    def _table(self) -> Any:
        from ..models import Deadline

        return Deadline.objects.using(self.timer.using).filter(timer=self.timer.name)

    def _pk(self, object_id: str) -> Any:
        return self.timer.model._meta.pk.to_python(object_id)

    def read(self, manager: Any, locked: LockedOrders) -> dict[Any, datetime | None]:
        if not locked.rows:
            return {}
        found = (self._table().filter(object_id__in=[str(pk) for pk in locked.rows])
                 .values_list("object_id", "expires_at"))
        return {self._pk(object_id): expires_at for object_id, expires_at in found}

    def of(self, row: Any) -> datetime | None:
        return self._table().filter(object_id=str(row.pk)).values_list("expires_at", flat=True).first()

    def done(self, manager: Any, pks: Sequence[Any]) -> None:
        if pks:
            self._table().filter(object_id__in=[str(pk) for pk in pks]).delete()

    def _within(self, before: datetime | None, after: datetime | None, until: datetime | None) -> Any:
        bounds = {"expires_at__lt": before, "expires_at__gt": after, "expires_at__lte": until}
        return self._table().filter(**{lookup: value for lookup, value in bounds.items() if value is not None})

    def walk(self, rows: Any, chunk: int, *, before: datetime | None = None, after: datetime | None = None,
             until: datetime | None = None) -> Rows:
        """The deadlines of ``rows`` (pending, not settled): the deadline table walked in order, each
        chunk's keys looked up among ``rows`` (one more query a chunk), so a settled row that keeps
        its deadline is neither walked by the scan nor counted overdue."""
        for part in rows_by_deadline(self._within(before, after, until), chunk, key="object_id"):
            deadlines = {self._pk(object_id): expires_at for object_id, expires_at in part}
            present = set(rows.filter(pk__in=list(deadlines)).values_list("pk", flat=True))
            found = [(pk, expires_at) for pk, expires_at in deadlines.items() if pk in present]
            if found:
                yield found

    def count(self, rows: Any, *, before: datetime | None = None, after: datetime | None = None,
              until: datetime | None = None) -> int:
        return sum(map(len, self.walk(rows, _COUNT_CHUNK, before=before, after=after, until=until)))

    def count_held(self, rows: Any, hold: Q, *, before: datetime, since: datetime | None) -> int:
        held = _meeting(rows, hold)
        return sum(int(held.filter(pk__in=[pk for pk, _at in part]).count())
                   for part in self.walk(rows, _COUNT_CHUNK, before=before, after=since))

    def put(self, row: Any, at: datetime) -> None:
        """From a save of ``row`` (which holds its lock, or just committed it): its deadline, and
        Redis told once the save's transaction commits."""
        from ..models import Deadline

        _aware(at)
        Deadline.objects.using(self.timer.using).update_or_create(
            timer=self.timer.name, object_id=str(row.pk), defaults={"expires_at": at})
        self.timer.schedule([row])

    def drop(self, row: Any) -> None:
        """From a save that took ``row`` out of waiting: no deadline, off the queue after commit."""
        self._table().filter(object_id=str(row.pk)).delete()
        self.timer.unschedule([row])

    def set(self, row: Any, at: datetime | None) -> None:
        """Write (or delete) the row's deadline and schedule it once the transaction commits."""
        from django.db import models, transaction

        from ..models import Deadline

        if at is not None:
            _aware(at)
        model = self.timer.model
        pk = row.pk if isinstance(row, models.Model) else model._meta.pk.to_python(row)
        using = self.timer.using
        with transaction.atomic(using=using):
            # Locked: an act on the row in progress commits first, and then the new deadline is
            # the next one; never a deadline written under an act that does not see it.
            if not model._base_manager.db_manager(using).select_for_update().filter(pk=pk).exists():
                raise model.DoesNotExist(f"{model.__name__} {pk!r} does not exist.")
            if at is None:
                self._table().filter(object_id=str(pk)).delete()
            else:
                Deadline.objects.using(using).update_or_create(timer=self.timer.name, object_id=str(pk),
                                                               defaults={"expires_at": at})
            self.timer.schedule([row if isinstance(row, models.Model) else model(pk=pk)])


def _aware(at: Any) -> None:
    from django.utils import timezone

    if not isinstance(at, datetime) or timezone.is_naive(at):
        raise ValueError(f"a deadline must be an aware datetime (or None: no deadline), got {at!r}")
