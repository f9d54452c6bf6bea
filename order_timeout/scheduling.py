"""Bridge from order rows to the queue: schedule after commit, never before.

Called by the model signals for ``save()``/``delete()``, and by you after
``QuerySet.update()`` or ``bulk_create()``, which send no signals. Work is
deferred with ``transaction.on_commit``, so a rolled-back order never reaches
Redis; a Redis failure is logged, never raised, because the order row is
already committed and the compensation scan will catch up with it.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Iterable
from functools import partial
from typing import TYPE_CHECKING

from django.db import router, transaction

from .codec import deadline_score, order_member
from .exceptions import QueueUnavailable
from .queue import TimeoutQueue

if TYPE_CHECKING:
    from .models import AbstractTimeoutOrder

logger = logging.getLogger("order_timeout")


def _database(order: AbstractTimeoutOrder) -> str:
    return order._state.db or router.db_for_write(type(order), instance=order)


def _sync(deadlines: dict[str, int], gone: list[str]) -> None:
    try:
        TimeoutQueue.from_settings().sync(deadlines, gone)
    except QueueUnavailable:
        logger.warning(
            "Could not update the timeout queue for %d order(s); the compensation "
            "scan will close them if they expire: %s",
            len(deadlines) + len(gone), ", ".join([*deadlines, *gone][:20]),
            exc_info=True,
        )


def schedule(orders: Iterable[AbstractTimeoutOrder]) -> None:
    """Make the queue follow these rows once the transaction commits.

    Unpaid orders are (re)scheduled at their ``expires_at``; any other order
    is taken off the queue.
    """
    by_database: dict[str, tuple[dict[str, int], list[str]]] = defaultdict(lambda: ({}, []))
    for order in orders:
        deadlines, gone = by_database[_database(order)]
        member = order_member(order.pk)
        if order.status == order.Status.UNPAID and order.expires_at is not None:
            deadlines[member] = deadline_score(order.expires_at)
        else:
            gone.append(member)
    for using, (deadlines, gone) in by_database.items():
        transaction.on_commit(partial(_sync, deadlines, gone), using=using)


def unschedule(orders: Iterable[AbstractTimeoutOrder]) -> None:
    """Take these orders off the queue once the transaction commits."""
    by_database: dict[str, list[str]] = defaultdict(list)
    for order in orders:
        by_database[_database(order)].append(order_member(order.pk))
    for using, gone in by_database.items():
        transaction.on_commit(partial(_sync, {}, gone), using=using)
