"""The shop's payment rules, as a real shop wires them into ``ORDER_TIMEOUT``.

    ORDER_TIMEOUT = {
        "HOLD_CONDITION": Q(payments__state="pending"),    # or "testproject.shop.payments.in_flight"
        "DEADLINE_POLICY": "testproject.shop.payments.deadline_by_payment_method",
        "REMINDERS": [900, 60],
    }
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from django.db.models import Q
from django.utils import timezone

from .models import PaymentState

# How long each payment method may take: a card (3-D Secure) is minutes, a bank transfer days.
TIME_TO_PAY = {
    "card": timedelta(minutes=15),
    "wallet": timedelta(minutes=15),
    "pay_by_link": timedelta(hours=24),
    "bank_transfer": timedelta(days=3),
}
# Paid on invoice (B2B) or taken by staff by hand: these orders never expire.
NEVER_EXPIRE = {"invoice", "manual"}


def deadline_by_payment_method(order: Any) -> datetime | None:
    """``DEADLINE_POLICY``: the deadline of an unpaid order saved without one."""
    method = getattr(order, "payment_method", "card")
    if method in NEVER_EXPIRE:
        return None
    return timezone.now() + TIME_TO_PAY[method]  # an unknown method raises: the default applies


def in_flight() -> Q:
    """``HOLD_CONDITION``: a payment started and not confirmed yet holds its order."""
    return Q(payments__state=PaymentState.PENDING)
