"""The baselines' way of closing: one transaction per order (the seeds' path).

Same model, same row lock, same status check, same ``order_expired`` signal as
``order_timeout.closing``, so the benchmark compares scheduling and batching,
not different business logic.
"""

from __future__ import annotations

from datetime import datetime

from django.db import transaction
from django.utils import timezone

from order_timeout.models import TIMEOUT_REASON, Order, Status
from order_timeout.signals import order_expired


def close_one(pk: int) -> datetime | None:
    """Close order ``pk`` if it is still unpaid and due.

    Returns the row's deadline when it is unpaid but not yet due (a timer
    that fired a little early), so the caller can try again then; else None.
    """
    with transaction.atomic():
        order = Order.objects.select_for_update().filter(pk=pk).first()
        now = timezone.now()
        if order is None or order.status != Status.UNPAID or order.expires_at is None:
            return None
        if order.expires_at > now:
            return order.expires_at
        values = {"status": Status.CLOSED, "closed_at": now, "close_reason": TIMEOUT_REASON}
        Order.objects.filter(pk=pk).update(**values)
        for name, value in values.items():
            setattr(order, name, value)
        order_expired.send(sender=Order, order=order)
    return None
