"""Bridge from rows to the queue: schedule after commit, never before.

Holds the receivers that mirror order rows into Redis (connected in
``apps.py`` for the configured order model), and ``schedule``/``unschedule``
for you to call after ``QuerySet.update()`` or ``bulk_create()``, which send
no signals. Each kind of timer says what Redis must hold for a row
(``Timer.follow``); the order close and its reminders follow the order
model's rows here, a declared timer follows its own (``timers.following``).
Work is deferred with ``transaction.on_commit``, so a rolled-back row never
reaches Redis; a Redis failure is logged, never raised, because the row is
already committed and the compensation scan will catch up with it (both in
``timers.syncing``, which the kinds use too). This module imports the kinds;
nothing in ``timers`` imports it.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from django.db.models.signals import post_delete, post_save

from .signals import timeout_state_changed
from .timers.syncing import follow, forget

if TYPE_CHECKING:
    from .models import TimeoutOrderMixin
    from .timers.kind import Kind

logger = logging.getLogger("order_timeout")


def order_kinds() -> list[Kind]:
    """The kinds that follow the order model's rows: the close, and the reminders if any are asked for."""
    from .timers.registry import order_kinds as kinds

    return kinds()


def schedule(orders: Iterable[TimeoutOrderMixin]) -> None:
    """Make the queue follow these orders once the transaction commits.

    Orders in an unpaid status with a deadline are (re)scheduled at their
    ``expires_at`` (and their reminders before it); any other order is taken
    off the queue.
    """
    follow(order_kinds(), orders, remember=True)


def unschedule(orders: Iterable[TimeoutOrderMixin]) -> None:
    """Take these orders off the queue once the transaction commits."""
    forget(order_kinds(), orders)


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
