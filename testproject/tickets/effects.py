"""What an expiry does in the ticket shop, whoever expires the order (its own closer, or the app)."""

from __future__ import annotations

from collections.abc import Sequence

from .models import ExpiryLog, Invoice, InvoiceState, LedgerEntry, TicketOrder


def book(order: TicketOrder) -> None:
    """At checkout: the order's invoice, and its seats booked in the ledger."""
    Invoice.objects.create(order=order)
    LedgerEntry.objects.create(order=order, amount=order.amount, reason="booked")


def expire_effects(orders: Sequence[TicketOrder]) -> None:
    """The expiry's effects: a log entry, the invoice cancelled, the seats given back (the ledger at 0)."""
    ids = [order.pk for order in orders]
    ExpiryLog.objects.bulk_create([ExpiryLog(order_id=pk) for pk in ids])
    Invoice.objects.filter(order_id__in=ids).update(state=InvoiceState.CANCELLED)
    LedgerEntry.objects.bulk_create([LedgerEntry(order_id=order.pk, amount=-order.amount, reason="expired")
                                     for order in orders])
