"""The ticket shop's declaration of the app's timers, from outside its models.

Its order expires at its own ``pay_by``; the app's act is the shop's own expiry (``effects``), and
its saves are guarded, because its payment confirmation does not lock. Its seat holds, whose
column has no index, are mirrored into the app's table and follow ``hold_until`` when the shop
extends a hold.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django.db.models import Q

from order_timeout import timers

from .effects import expire_effects
from .models import SeatHold, TicketOrderStatus


class TicketOrderExpires(timers.Timer):
    name = "ticket-order-expiry"
    deadline = "pay_by"
    pending = Q(status=TicketOrderStatus.PENDING)
    values = {"status": TicketOrderStatus.EXPIRED}
    # Its payment confirmation reads, then writes "paid" without a lock: a write from a read
    # older than the expiry is refused, never undoes it.
    guard_saves = True

    def fire(self, orders: list[Any], now: datetime) -> None:
        expire_effects(orders)

    def public_name(self, row: Any) -> str:
        # Its API and its customers know an order by its code, never by its key.
        return row.code


class SeatHoldLapses(timers.Timer):
    name = "seat-hold-lapses"
    deadline = None  # hold_until has no index, and the table is not the shop's to index
    deadline_follows = ("hold_until",)
    pending = Q(state="held")
    values = {"state": "released"}

    def waits(self, hold: SeatHold) -> bool:
        return hold.state == "held"

    def deadline_for(self, hold: SeatHold) -> datetime | None:
        return hold.hold_until
