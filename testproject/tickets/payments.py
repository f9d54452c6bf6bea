"""The ticket shop's payment confirmation, as the shop wrote it: it does not lock the order.

It reads the order, asks the payment provider to capture the money (which takes a while), and
then writes "paid" from what it read. Nothing keeps the order from expiring in between; with the
app's ``guard_saves`` on, the write of a row expired meanwhile is refused (``StaleOrderStatus``),
and the confirmation, run again, reads the row as it is and takes the shop's own path for an
expired order: it accepts the late payment.
"""

from __future__ import annotations

from collections.abc import Callable

from django.db import transaction

from order_timeout.exceptions import StaleOrderStatus

from .models import Invoice, InvoiceState, LedgerEntry, TicketOrder, TicketOrderStatus

Capture = Callable[[TicketOrder], None]


def capture_at_the_provider(order: TicketOrder) -> None:
    """The provider's capture (a test passes its own, which waits for the deadline)."""


def confirm_payment(order_id: int, capture: Capture = capture_at_the_provider) -> str:
    """Read, capture, write: the shop's code, with no row lock. What it did, in a word."""
    order = TicketOrder.objects.get(pk=order_id)
    if order.status == TicketOrderStatus.EXPIRED:
        return accept_late_payment(order)
    if order.status != TicketOrderStatus.PENDING:
        return "already paid"
    capture(order)
    with transaction.atomic():
        order.status = TicketOrderStatus.PAID
        order.save()
        Invoice.objects.filter(order=order).update(state=InvoiceState.PAID)
    return "paid"


def accept_late_payment(order: TicketOrder) -> str:
    """The shop's own path for money that came after the expiry: the order is paid after all, its
    seats booked again and its invoice paid (the shop's rule; another shop would refund)."""
    with transaction.atomic():
        order.status = TicketOrderStatus.PAID
        order.save()
        Invoice.objects.filter(order=order).update(state=InvoiceState.PAID)
        LedgerEntry.objects.create(order=order, amount=order.amount, reason="late payment")
    return "paid late"


def pay(order_id: int, capture: Capture = capture_at_the_provider) -> str:
    """The payment webhook: ``confirm_payment``, run once more when its write was refused as stale."""
    try:
        return confirm_payment(order_id, capture)
    except StaleOrderStatus:
        return confirm_payment(order_id, capture=lambda order: None)  # captured already
