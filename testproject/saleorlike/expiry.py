"""The shop's own expiry of Saleor's unconfirmed orders, declared from outside Saleor's code.

What docs/saleor.md has the shop write in its own app (``shop_timeouts/timers.py``), here on the
Saleor-shaped models: the deadline is the channel's window from ``created_at``, kept in the app's
own table (no migration of Saleor's); the order must still be unconfirmed; money on its way holds
it; money received settles it; the close is Saleor's own (status ``expired``, ``expired_at``, its
vouchers, events and stock).
"""

from __future__ import annotations

from collections import Counter
from datetime import datetime, timedelta
from typing import Any

from django.db.models import F, Q

from order_timeout import timers

from .models import Allocation, Channel, Order, OrderChargeStatus, OrderEvent, OrderStatus, Stock, VoucherCode


class UnconfirmedOrderExpires(timers.Timer):
    name = "saleor-order-expiry"
    deadline = None  # Saleor's table is not the shop's to migrate: deadlines live in the app's
    pending = Q(status=OrderStatus.UNCONFIRMED)
    # Money on its way: a transaction with an authorization or a charge pending, a payment pending.
    hold = (Q(payment_transactions__authorize_pending_value__gt=0)
            | Q(payment_transactions__charge_pending_value__gt=0)
            | Q(payments__is_active=True, payments__charge_status="pending"))
    # Money received: an unconfirmed order that waits for staff, not for its payment.
    settled = Q(charge_status__in=[OrderChargeStatus.FULL, OrderChargeStatus.OVERCHARGED])
    values = {"status": OrderStatus.EXPIRED, "expired_at": timers.NOW}
    final = True  # an expired order is never saved back to unconfirmed, nor confirmed

    def waits(self, order: Order) -> bool:
        return order.status == OrderStatus.UNCONFIRMED

    def deadline_for(self, order: Order) -> datetime | None:
        minutes = Channel.objects.filter(pk=order.channel_id).values_list("expire_orders_after", flat=True).first()
        return order.created_at + timedelta(minutes=minutes) if minutes and minutes > 0 else None

    def fire(self, orders: list[Any], now: datetime) -> None:
        """Saleor's own close, in the same transaction: vouchers, one event each, the stock."""
        ids = [order.pk for order in orders]
        codes = Counter(order.voucher_code for order in orders if order.voucher_code)
        for code, uses in codes.items():
            VoucherCode.objects.filter(code=code).update(used=F("used") - uses)
        OrderEvent.objects.bulk_create([OrderEvent(order_id=pk, type="expired") for pk in ids])
        released = Counter[int]()
        for stock, quantity in Allocation.objects.filter(order_id__in=ids).values_list("stock_id",
                                                                                      "quantity_allocated"):
            released[stock] += quantity
        for stock, quantity in released.items():
            Stock.objects.filter(pk=stock).update(quantity_allocated=F("quantity_allocated") - quantity)
        Allocation.objects.filter(order_id__in=ids).update(quantity_allocated=0)
