"""The shop's own answer to a charge reported after the expiry, as docs/saleor.md has its app give it.

Saleor records the money of a charge reported for an expired order (no hold covered it: the
payment was not pending at the deadline). Its own code never refunds an order's charge; on a
channel that confirms orders automatically, its ``handle_fully_paid_order`` then tries to
confirm the order, which the expiry's ``final`` refuses (a ``ValidationError``: the payment
app's ``transactionEventReport`` gets an ``INVALID`` error once). The shop's app asks for the
money back instead: a refund request for the part of the charge not asked back yet, once per
charge, however often the transaction is saved (in Saleor, ``request_refund_action`` after the
commit).
"""

from __future__ import annotations

from decimal import Decimal
from typing import Any

from django.db.models import Sum

from .models import Order, OrderStatus, TransactionEvent, TransactionItem

REFUND_REQUEST = "refund_request"


def refund_a_charge_after_the_expiry(sender: Any, instance: TransactionItem, raw: bool = False, **kwargs: Any) -> None:
    """post_save of a transaction: money charged for an expired order is asked back."""
    if raw or instance.order_id is None or instance.charged_value <= 0:
        return
    if not Order.objects.filter(pk=instance.order_id, status=OrderStatus.EXPIRED).exists():
        return
    asked = instance.events.filter(type=REFUND_REQUEST).aggregate(total=Sum("amount_value"))["total"] or Decimal(0)
    if instance.charged_value > asked:
        TransactionEvent.objects.create(transaction=instance, type=REFUND_REQUEST,
                                        amount_value=instance.charged_value - asked)
