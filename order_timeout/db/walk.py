"""Walk rows in deadline order along a ``(..., deadline)`` index, a chunk at a time.

Keyset pagination on ``(deadline, key)``, by default ``(expires_at, pk)``
along the orders' ``(status, expires_at)`` index: never OFFSET, never the
whole table in memory, and a row inserted behind the walk cannot shift it.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime
from typing import Any

from django.db import connections
from django.db.models import Q, QuerySet


def rows_by_deadline(queryset: QuerySet[Any], size: int, *, field: str = "expires_at",
                     key: str = "pk") -> Iterator[list[tuple[Any, datetime]]]:
    """``(key, deadline)`` rows in deadline order, then by ``key``, ``size`` at a time."""
    ordered = queryset.order_by(field, key).values_list(key, field)
    vendor = connections[queryset.db].vendor
    after: tuple[datetime, Any] | None = None
    while True:
        page = ordered if after is None else ordered.filter(
            after_row(*after, vendor=vendor, field=field, key=key))
        rows = list(page[:size])
        if not rows:
            return
        yield rows
        after = (rows[-1][1], rows[-1][0])


def after_row(deadline: datetime, last: Any, *, vendor: str, field: str = "expires_at", key: str = "pk") -> Q:
    """The rows that come after ``(deadline, last)`` in ``(field, key)`` order.

    Always led by ``field >= deadline``, the bound an index scan starts from.
    Without it PostgreSQL finds no start in the OR: it reads the index from
    the first unpaid row and filters, so each chunk costs more than the one
    before (35 ms at chunk 400 of 400,000 rows, against 2.8 ms at chunk 10).

    What follows the bound differs. MariaDB (and MySQL) seek to
    ``(deadline, pk)`` from the OR, since InnoDB ends every index in the
    primary key: a deadline thousands of orders share costs no more than
    another. PostgreSQL's index holds no pk, so it reads a shared deadline
    whole either way; but it would take the OR after the bound for a second,
    independent bound and expect too few rows near the end of the table, then
    read and sort everything left instead of the next chunk. It gets the
    complement instead, which it expects nearly every row to pass.
    """
    bound = Q(**{f"{field}__gte": deadline})
    if vendor == "postgresql":
        return bound & ~Q(**{field: deadline, f"{key}__lte": last})
    return bound & (Q(**{f"{field}__gt": deadline}) | Q(**{field: deadline, f"{key}__gt": last}))
