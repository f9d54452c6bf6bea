"""Bridge from order rows to the queue: schedule after commit, never before.

Holds the receivers that mirror rows into Redis (connected in ``apps.py`` for
the configured order model), and ``schedule``/``unschedule`` for you to call
after ``QuerySet.update()`` or ``bulk_create()``, which send no signals. Work
is deferred with ``transaction.on_commit``, so a rolled-back order never
reaches Redis; a Redis failure is logged, never raised, because the order row
is already committed and the compensation scan will catch up with it.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Iterable
from functools import partial
from typing import TYPE_CHECKING, Any

from django.db import router, transaction
from django.db.models.signals import post_delete, post_save

from .codec import deadline_score, order_member
from .exceptions import QueueUnavailable
from .queue import TimeoutQueue
from .signals import timeout_state_changed

if TYPE_CHECKING:
    from .models import TimeoutOrderMixin

logger = logging.getLogger("order_timeout")


def _database(order: TimeoutOrderMixin) -> str:
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


def schedule(orders: Iterable[TimeoutOrderMixin]) -> None:
    """Make the queue follow these rows once the transaction commits.

    Orders in an unpaid status with a deadline are (re)scheduled at their
    ``expires_at``; any other order is taken off the queue.
    """
    by_database: dict[str, tuple[dict[str, int], list[str]]] = defaultdict(lambda: ({}, []))
    for order in orders:
        deadlines, gone = by_database[_database(order)]
        member = order_member(order.pk)
        if order.awaits_payment:
            assert order.expires_at is not None
            deadlines[member] = deadline_score(order.expires_at)
        else:
            gone.append(member)
    for using, (deadlines, gone) in by_database.items():
        transaction.on_commit(partial(_sync, deadlines, gone), using=using)


def unschedule(orders: Iterable[TimeoutOrderMixin]) -> None:
    """Take these orders off the queue once the transaction commits."""
    by_database: dict[str, list[str]] = defaultdict(list)
    for order in orders:
        by_database[_database(order)].append(order_member(order.pk))
    for using, gone in by_database.items():
        transaction.on_commit(partial(_sync, {}, gone), using=using)


# -- the receivers ------------------------------------------------------------


def order_saved(sender: Any, instance: TimeoutOrderMixin, raw: bool = False,
                update_fields: frozenset[str] | None = None, **kwargs: Any) -> None:
    """post_save: mirror the row's status and deadline into the queue after commit."""
    if raw:
        return
    if update_fields is not None and not {instance.TIMEOUT_STATUS_FIELD, "expires_at"} & set(update_fields):
        return
    # Unchanged status and deadline: leave Redis alone, so that a save during
    # a retry's backoff does not pull the retry forward to the old deadline.
    if not kwargs.get("created") and not instance.queue_state_changed():
        return
    instance._remember_queue_state()
    schedule([instance])


def order_deleted(sender: Any, instance: TimeoutOrderMixin, **kwargs: Any) -> None:
    """post_delete: take the order off the queue after commit."""
    unschedule([instance])


def state_changed(sender: Any, orders: list[TimeoutOrderMixin], **kwargs: Any) -> None:
    """timeout_state_changed (mark_paid, extend_deadline): mirror the rows after commit."""
    schedule(orders)


def connect_receivers(model: type[TimeoutOrderMixin]) -> None:
    """Keep the queue in step with ``model``'s rows (done for ``ORDER_MODEL`` when Django starts)."""
    uid = f"order_timeout.{model._meta.label_lower}"
    post_save.connect(order_saved, sender=model, dispatch_uid=f"{uid}.saved")
    post_delete.connect(order_deleted, sender=model, dispatch_uid=f"{uid}.deleted")
    timeout_state_changed.connect(state_changed, sender=model, dispatch_uid=f"{uid}.changed")


def disconnect_receivers(model: type[TimeoutOrderMixin]) -> None:
    """Undo ``connect_receivers``."""
    uid = f"order_timeout.{model._meta.label_lower}"
    post_save.disconnect(sender=model, dispatch_uid=f"{uid}.saved")
    post_delete.disconnect(sender=model, dispatch_uid=f"{uid}.deleted")
    timeout_state_changed.disconnect(sender=model, dispatch_uid=f"{uid}.changed")
