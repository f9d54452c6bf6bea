"""What the scans walk and count of a kind's rows: the pending ones, by deadline, on the primary.

The compensation scan (heal, close, rebuild), the backfill and the status command read a kind's
rows through here, in keyset chunks (timers/deadlines.py walks them); the kind itself only says
what its rows are (``pending``, ``settled``, ``hold``) and when they fall due (``falls_due_early``,
``moot_past_deadline``).
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ..timers.kind import Kind

Chunks = Iterator[list[tuple[Any, datetime]]]


def overdue(kind: Kind, before: datetime, chunk: int, since: datetime | None = None) -> Chunks:
    """Rows still pending whose deadline is before ``before`` (and after ``since``), ``(pk, deadline)``
    in chunks; none for a kind whose act is moot past the deadline (a reminder)."""
    if kind.moot_past_deadline:
        return iter(())
    return kind.deadlines.walk(pending(kind), chunk, before=before, after=since)


def upcoming(kind: Kind, after: datetime | None, until: datetime | None, chunk: int) -> Chunks:
    """Rows still pending whose deadline is after ``after`` (and not after ``until``, reaching as far
    again as the kind's members fall due before their deadlines)."""
    reach = None if until is None else until + kind.falls_due_early()
    return kind.deadlines.walk(pending(kind), chunk, after=after, until=reach)


def count(kind: Kind, *, before: datetime | None = None, after: datetime | None = None,
          until: datetime | None = None) -> int:
    """How many pending rows have a deadline before ``before``, or after ``after`` (and not after ``until``)."""
    return kind.deadlines.count(pending(kind), before=before, after=after, until=until)


def overdue_and_held(kind: Kind, now: datetime) -> tuple[int, int]:
    """Pending rows past their deadline, as ``(overdue, held)``: those its hold holds within its
    longest hold wait for what holds them and are held, not overdue; past it they are overdue."""
    rows = pending(kind)
    past = kind.deadlines.count(rows, before=now)
    hold = kind.hold_condition()
    if hold is None or not past:
        return past, 0
    longest = kind.longest_hold()
    held = kind.deadlines.count_held(rows, hold, before=now, since=None if longest is None else now - longest)
    return past - held, held


def pending(kind: Kind) -> Any:
    """The rows still pending (and not settled by another column), on the primary: a replica may lag
    behind the acts a scan makes."""
    rows = kind.model._base_manager.db_manager(kind.using).filter(kind.pending)
    settled = kind.settled_condition()
    # As a subquery on the key: a condition over a related table must not repeat rows.
    return rows if settled is None else rows.exclude(pk__in=kind.model._base_manager.filter(settled).values("pk"))


def settled_count(kind: Kind) -> int:
    """Rows pending by their own columns that the settled condition settles."""
    settled = kind.settled_condition()
    if settled is None:
        return 0
    rows = kind.model._base_manager.db_manager(kind.using).filter(kind.pending)
    return int(rows.filter(pk__in=kind.model._base_manager.filter(settled).values("pk")).count())
