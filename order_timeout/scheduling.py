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
from dataclasses import dataclass, field
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


@dataclass
class _Change:
    """What one commit tells the queue, and the copies to mark as told once it has."""

    deadlines: dict[str, int] = field(default_factory=dict)
    gone: list[str] = field(default_factory=list)
    told: list[tuple[TimeoutOrderMixin, tuple[Any, Any]]] = field(default_factory=list)


def _sync(change: _Change) -> None:
    try:
        # Bounded: this runs in the request that saved the order.
        TimeoutQueue.for_saves().sync(change.deadlines, change.gone)
    except QueueUnavailable as exc:
        logger.warning(
            "Could not update the timeout queue for %d order(s) (%s); the compensation scan "
            "will close them if they expire: %s",
            len(change.deadlines) + len(change.gone), exc,
            ", ".join([*change.deadlines, *change.gone][:20]),
        )
        return
    for order, state in change.told:
        # Remembered only now: a rolled-back save told Redis nothing.
        order._queue_state = state


def schedule(orders: Iterable[TimeoutOrderMixin]) -> None:
    """Make the queue follow these rows once the transaction commits.

    Orders in an unpaid status with a deadline are (re)scheduled at their
    ``expires_at``; any other order is taken off the queue.
    """
    by_database: dict[str, _Change] = defaultdict(_Change)
    for order in orders:
        change = by_database[_database(order)]
        member = order_member(type(order), order.pk)
        if order.awaits_payment:
            assert order.expires_at is not None
            change.deadlines[member] = deadline_score(order.expires_at)
        else:
            change.gone.append(member)
        change.told.append((order, order._timeout_state()))
    for using, change in by_database.items():
        transaction.on_commit(partial(_sync, change), using=using)


def unschedule(orders: Iterable[TimeoutOrderMixin]) -> None:
    """Take these orders off the queue once the transaction commits."""
    by_database: dict[str, _Change] = defaultdict(_Change)
    for order in orders:
        by_database[_database(order)].gone.append(order_member(type(order), order.pk))
    for using, change in by_database.items():
        transaction.on_commit(partial(_sync, change), using=using)


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
