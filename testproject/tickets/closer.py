"""The ticket shop's own closer: a receiver of its periodic ``tick`` signal (sent by its cron job).

It reads the overdue pending orders and expires each from what it read, without a lock (as the
shop wrote it); the switch-over to the app turns it off (``TICKETS_OWN_CLOSER = False``, or
``disconnect_own_closer()``), docs/existing-model.md.
"""

from __future__ import annotations

from typing import Any

from django.db import transaction
from django.dispatch import Signal
from django.utils import timezone

from .effects import expire_effects
from .models import TicketOrder, TicketOrderStatus

# Sent every minute by the shop's cron job (``manage.py tickets_tick``, in the shop).
tick = Signal()
OWN_CLOSER = "tickets.own-closer"


def expire_overdue(sender: Any = None, **kwargs: Any) -> int:
    """Expire every pending order past ``pay_by``; how many."""
    expired = 0
    for order in TicketOrder.objects.filter(status=TicketOrderStatus.PENDING, pay_by__lt=timezone.now()):
        with transaction.atomic():
            order.status = TicketOrderStatus.EXPIRED
            order.save()
            expire_effects([order])
        expired += 1
    return expired


def connect_own_closer() -> None:
    tick.connect(expire_overdue, dispatch_uid=OWN_CLOSER)


def disconnect_own_closer() -> None:
    tick.disconnect(dispatch_uid=OWN_CLOSER)
