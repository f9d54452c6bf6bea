"""The ticket shop's order, its invoice and ledger, and a seat hold (the parts the expiry meets)."""

from decimal import Decimal

from django.db import models


class TicketOrderStatus(models.TextChoices):
    PENDING = "pending"
    PAID = "paid"
    EXPIRED = "expired"


class TicketOrder(models.Model):
    status = models.CharField(max_length=16, choices=TicketOrderStatus.choices, default=TicketOrderStatus.PENDING)
    # The shop's own payment deadline, indexed for its own closer's query.
    pay_by = models.DateTimeField(null=True, blank=True, db_index=True)
    # What the shop's API syncs on: every change of the row moves it.
    last_modified = models.DateTimeField(auto_now=True)
    amount = models.DecimalField(max_digits=10, decimal_places=2, default=Decimal("10.00"))

    @property
    def code(self) -> str:
        """What the shop's API and its customers call the order (its URLs take the code)."""
        return f"API{self.pk:04d}"


class InvoiceState(models.TextChoices):
    OPEN = "open"
    PAID = "paid"
    CANCELLED = "cancelled"


class Invoice(models.Model):
    order = models.OneToOneField(TicketOrder, related_name="invoice", on_delete=models.CASCADE)
    state = models.CharField(max_length=16, choices=InvoiceState.choices, default=InvoiceState.OPEN)


class LedgerEntry(models.Model):
    """The shop's books: an order's seats are booked at checkout and given back at its expiry."""

    order = models.ForeignKey(TicketOrder, related_name="ledger", on_delete=models.CASCADE)
    amount = models.DecimalField(max_digits=10, decimal_places=2)
    reason = models.CharField(max_length=32)


class ExpiryLog(models.Model):
    order = models.ForeignKey(TicketOrder, related_name="expiries", on_delete=models.CASCADE)
    at = models.DateTimeField(auto_now_add=True)


class SeatHold(models.Model):
    """A seat held for a checkout until ``hold_until``: a framework's column, with no index, that
    the shop cannot index (its table is not the shop's to migrate)."""

    seat = models.CharField(max_length=16)
    state = models.CharField(max_length=16, default="held")
    hold_until = models.DateTimeField(null=True, blank=True)


class PaymentState(models.TextChoices):
    CREATED = "created"
    CONFIRMED = "confirmed"
    REFUNDED = "refunded"


class Payment(models.Model):
    """One payment of an order, a row of its own beside it (the shop's ``OrderPayment``): its
    PayPal webhook, staff's "payment received" button and its REST API each confirm it."""

    order = models.ForeignKey(TicketOrder, related_name="payments", on_delete=models.CASCADE)
    provider = models.CharField(max_length=32, default="paypal")
    amount = models.DecimalField(max_digits=10, decimal_places=2, default=Decimal("10.00"))
    state = models.CharField(max_length=16, choices=PaymentState.choices, default=PaymentState.CREATED)
    confirmed_at = models.DateTimeField(null=True, blank=True)
