"""The public signals, and the receivers that keep Redis in step with rows.

``order_expired(sender=OrderModel, order=order)`` is sent once per order closed
for its deadline, inside the transaction that closes it: release stock and
coupons in your receiver and they commit (or roll back) with the close. A
receiver that raises leaves that order open for another try.

``orders_expired(sender=OrderModel, orders=[...])`` is sent once per closed
batch, after the per-order signals and in the same transaction, for shops that
release stock with one query per batch rather than one per order. (When a
receiver raised and the batch is closed again one order at a time, it is sent
once per order instead.)
"""

from __future__ import annotations

from typing import Any

from django.dispatch import Signal

order_expired = Signal()
orders_expired = Signal()

# Only these fields move an order on or off the queue.
_QUEUE_FIELDS = frozenset({"status", "expires_at"})


def order_saved(sender: Any, instance: Any, raw: bool = False,
                update_fields: frozenset[str] | None = None, **kwargs: Any) -> None:
    """post_save: mirror the row's status and deadline into the queue after commit."""
    # Imported here so that closing, which sends order_expired, stays free of Redis.
    from .scheduling import schedule

    if raw:
        return
    if update_fields is not None and not _QUEUE_FIELDS & set(update_fields):
        return
    # Unchanged status and deadline: leave Redis alone, so that a save during
    # a retry's backoff does not pull the retry forward to the old deadline.
    if not kwargs.get("created") and not instance.queue_state_changed():
        return
    instance._remember_queue_state()
    schedule([instance])


def order_deleted(sender: Any, instance: Any, **kwargs: Any) -> None:
    """post_delete: take the order off the queue after commit."""
    from .scheduling import unschedule

    unschedule([instance])
