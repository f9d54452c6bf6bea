"""The ticket shop's payment confirmations, as the shop wrote them: neither locks the order.

``confirm_payment`` reads the order, asks the payment provider to capture the money (which takes
a while), and then writes "paid" from what it read, in one transaction. Nothing keeps the order
from expiring in between; with the app's ``guard_saves`` on, the write of a row expired meanwhile
is refused (``StaleOrderStatus``), the transaction rolls back whole, and the confirmation, run
again, reads the row as it is and takes the shop's own path for an expired order: it accepts the
late payment.

``confirm`` is the other shape, the shop's ``OrderPayment.confirm()``: called outside a
transaction (by its PayPal webhook, staff's "payment received" button and its REST API), it
commits the payment's own row first and saves the order after. When that order save is refused,
the payment stays confirmed on an expired order, and a webhook run again finds the payment
confirmed and does nothing: only the app's record (``RefusedWrite``) tells staff to refund.
``confirm_with_the_order_locked`` is what the shop must do instead (docs/timers.md): the payment's
row and the order's save in one transaction, with the order locked.
"""

from __future__ import annotations

from collections.abc import Callable

from django.db import transaction
from django.utils import timezone

from order_timeout.exceptions import StaleOrderStatus

from .models import Invoice, InvoiceState, LedgerEntry, Payment, PaymentState, TicketOrder, TicketOrderStatus

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


# -- the payment's own row, committed apart from the order ------------------------------------

def confirm(payment_id: int, capture: Capture | None = None) -> str:
    """The shop's ``OrderPayment.confirm()``, called outside a transaction: the payment's row is
    saved (and so committed) first, then the order is marked paid from the copy read with the
    payment. What it did, in a word."""
    payment = Payment.objects.select_related("order").get(pk=payment_id)
    if payment.state == PaymentState.CONFIRMED:
        return "already confirmed"  # the provider's webhook, retried
    order = payment.order
    (capture or capture_at_the_provider)(order)
    return _record(payment, order)


def paypal_webhook(payment_id: int) -> str:
    """PayPal's notification that the money was captured: ``confirm()``, no transaction around it."""
    return confirm(payment_id)


def staff_payment_received(payment_id: int) -> str:
    """Staff's "payment received" button (a bank transfer seen on the statement)."""
    return confirm(payment_id)


# -- what the shop must do instead (docs/timers.md) --------------------------------------------

def confirm_with_the_order_locked(payment_id: int, capture: Capture | None = None) -> str:
    """The payment's row and the order's save in one transaction, the order locked first, as
    ``mark_paid()`` does: the expiry either came before (the order is read expired, and the shop
    takes its own path for it in the same transaction) or waits until this commits."""
    payment = Payment.objects.get(pk=payment_id)
    (capture or capture_at_the_provider)(payment.order)
    with transaction.atomic():
        order = TicketOrder.objects.select_for_update().get(pk=payment.order_id)
        payment = Payment.objects.select_for_update().get(pk=payment_id)
        if payment.state == PaymentState.CONFIRMED:
            return "already confirmed"
        return _record(payment, order)


def _record(payment: Payment, order: TicketOrder) -> str:
    """The payment confirmed, then the order paid with its invoice, or the shop's path for a
    payment that came after the expiry: the same writes in both shapes; what differs is whether
    they share one transaction with the order locked first."""
    payment.state, payment.confirmed_at = PaymentState.CONFIRMED, timezone.now()
    payment.save(update_fields=["state", "confirmed_at"])
    if order.status == TicketOrderStatus.EXPIRED:
        return accept_late_payment(order)
    order.status = TicketOrderStatus.PAID
    order.save()
    Invoice.objects.filter(order=order).update(state=InvoiceState.PAID)
    return "paid"
