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

from .codec import deadline_score, order_member, reminder_member
from .conf import settings
from .keys import REMIND
from .queue import TimeoutQueue
from .redaction import masked
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
    # The same for the reminders' queue: one member per reminder of each order.
    reminders: dict[str, int] = field(default_factory=dict)
    reminders_gone: list[str] = field(default_factory=list)
    told: list[tuple[TimeoutOrderMixin, tuple[Any, Any]]] = field(default_factory=list)

    def add(self, order: TimeoutOrderMixin, leads: list[int]) -> None:
        """The order's close at its deadline and each reminder before it, or none of them."""
        model = type(order)
        member = order_member(model, order.pk)
        reminders = [reminder_member(model, order.pk, lead) for lead in leads]
        if order.awaits_payment:
            assert order.expires_at is not None
            self.deadlines[member] = score = deadline_score(order.expires_at)
            self.reminders.update((reminder, score - lead) for reminder, lead in zip(reminders, leads,
                                                                                   strict=True))
        else:
            self.gone.append(member)
            self.reminders_gone += reminders


def _sync(change: _Change) -> None:
    try:
        # Bounded: this runs in the request that saved the order.
        queue = TimeoutQueue.for_saves()
        queue.sync(change.deadlines, change.gone)
        if change.reminders or change.reminders_gone:
            queue.of_kind(REMIND).sync(change.reminders, change.reminders_gone)
    except Exception as exc:  # noqa: BLE001 - the rows committed: no Redis trouble may fail the save
        # QueueUnavailable above all, but also a LOCATION the cluster factory refuses
        # (ImproperlyConfigured, which manage.py check reports as E014).
        logger.warning(
            "Could not update the timeout queue for %d order(s) (%s: %s); the compensation scan "
            "will close them if they expire: %s",
            len(change.deadlines) + len(change.gone), type(exc).__name__, masked(exc),
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
    leads = settings.reminders()
    for order in orders:
        change = by_database[_database(order)]
        change.add(order, leads)
        change.told.append((order, order._timeout_state()))
    for using, change in by_database.items():
        transaction.on_commit(partial(_sync, change), using=using)


def unschedule(orders: Iterable[TimeoutOrderMixin]) -> None:
    """Take these orders off the queue once the transaction commits."""
    by_database: dict[str, _Change] = defaultdict(_Change)
    leads = settings.reminders()
    for order in orders:
        change = by_database[_database(order)]
        change.gone.append(order_member(type(order), order.pk))
        change.reminders_gone += [reminder_member(type(order), order.pk, lead) for lead in leads]
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
