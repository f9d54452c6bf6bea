"""The shop's own timers, declared from outside its models (found at start-up, as admin.py is).

Three timed transitions besides the app's order close, each on the one lifecycle:

- a stock reservation lapses at its deadline and gives its stock back, unless
  the checkout that holds it is completing (then it waits for that);
- a delivered order completes when its return window ends, unless a return
  was opened;
- a ``PlainOrder``, whose table the shop cannot migrate, is cancelled at its
  payment deadline, kept in the app's own table; once cancelled it can never
  be saved as paid.
"""

from __future__ import annotations

import os
from collections import Counter
from datetime import datetime
from typing import Any

from django.db.models import F, Q

from order_timeout import timers

from .models import OrderStatusChange, PlainOrder, ShopOrder, StockRecord, StockReservation


def declared(model: Any) -> Any:
    """``timers.register(model)``, unless SHOP_TIMERS=0 (the benchmark measures the order close alone)."""
    return timers.register(model) if os.environ.get("SHOP_TIMERS", "1") == "1" else (lambda cls: cls)


@declared(StockReservation)
class ReservationLapses(timers.Timer):
    name = "reservation-lapses"
    deadline = "expires_at"
    pending = Q(state="held")
    values = {"state": "released", "released_at": timers.NOW}
    # A checkout completing at the deadline keeps its stock: looked at again until it is done.
    hold = Q(checkout__state="completing")

    def fire(self, rows: list[Any], now: datetime) -> None:
        """The stock comes back: one UPDATE per stock record of the batch."""
        back = Counter[int]()
        for reservation in rows:
            back[reservation.stockrecord_id] += reservation.quantity
        for stockrecord, quantity in back.items():
            StockRecord.objects.filter(pk=stockrecord).update(num_allocated=F("num_allocated") - quantity)


@declared(ShopOrder)
class CompleteAfterDelivery(timers.Timer):
    name = "complete-after-delivery"
    deadline = "completes_at"
    # An open return keeps a delivered order from completing (for good: the return decides).
    pending = Q(status="Delivered") & ~Q(returns__state="open")
    values = {"status": "Complete"}

    def fire(self, rows: list[Any], now: datetime) -> None:
        """The shop's status history, one INSERT for the batch."""
        OrderStatusChange.objects.bulk_create([
            OrderStatusChange(order=order, old_status="Delivered", new_status="Complete") for order in rows])


@declared(PlainOrder)
class PlainOrderPayment(timers.Timer):
    name = "plain-order-payment"
    deadline = None  # the table is not ours to migrate: the deadlines live in the app's own
    pending = Q(status="pending")
    values = {"status": "cancelled"}
    final = True  # a cancelled PlainOrder is never saved as paid
