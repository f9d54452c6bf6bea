"""Walk order rows along the ``(status, expires_at)`` index, a chunk at a time.

Keyset pagination on ``(expires_at, pk)``: never OFFSET, never the whole
table in memory, and a row inserted behind the walk cannot shift it.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime
from typing import Any

from django.db.models import Q, QuerySet


def rows_by_deadline(queryset: QuerySet[Any], size: int) -> Iterator[list[tuple[Any, datetime]]]:
    """(pk, expires_at) rows in deadline order, ``size`` at a time."""
    ordered = queryset.order_by("expires_at", "pk").values_list("pk", "expires_at")
    after: tuple[datetime, Any] | None = None
    while True:
        page = ordered
        if after is not None:
            page = page.filter(Q(expires_at__gt=after[0]) | Q(expires_at=after[0], pk__gt=after[1]))
        rows = list(page[:size])
        if not rows:
            return
        yield rows
        after = (rows[-1][1], rows[-1][0])
