import uuid
from decimal import Decimal

from django.db import models
from django.utils import timezone

from order_timeout.models import AbstractTimeoutOrder, TimeoutOrderMixin


class Expiry(models.Model):
    """One row per ``order_expired`` delivery: what a shop's stock release would write.

    Committed with the close, so counting rows counts closes that really happened.
    """

    order_id = models.CharField(max_length=64, db_index=True)
    model = models.CharField(max_length=100)
    delivered_at = models.DateTimeField(auto_now_add=True)


class Purchase(AbstractTimeoutOrder):
    """A shop's own order model built on the app's whole abstract order."""

    customer = models.CharField(max_length=100, blank=True)


# -- A shop that had its orders before it had timeouts --------------------------
# Shaped like an e-commerce framework's order: its own status column (100
# characters, no choices), a pipeline its dashboard moves orders along, a
# status-change history and stock allocated per line.


class InvalidOrderStatus(Exception):
    pass


class AbstractShopOrder(models.Model):
    """The framework's abstract order (think django-oscar's ``AbstractOrder``)."""

    # Which statuses may follow which: the shop's dashboard moves orders along it.
    pipeline = {
        "Draft": ("Pending", "Cancelled"),
        "Pending": ("Paid", "Cancelled"),
        "Paid": ("Being processed", "Cancelled"),
        "Being processed": ("Delivered", "Complete", "Cancelled"),
        # Complete once the return window has passed (the shop's timer, testproject/shop/timers.py).
        "Delivered": ("Complete", "Returned"),
        "Cancelled": ("Archived",),
        "Complete": ("Archived",),
    }

    number = models.CharField("order number", max_length=128, blank=True)
    status = models.CharField("status", max_length=100, default="Pending")
    # What the customer chose at checkout: the deadline policy gives each its own time to pay.
    payment_method = models.CharField(max_length=32, default="card")
    total = models.DecimalField(max_digits=12, decimal_places=2, default=Decimal("0"))
    date_placed = models.DateTimeField(default=timezone.now)

    class Meta:
        abstract = True
        ordering = ["-date_placed"]
        verbose_name = "shop order"
        verbose_name_plural = "shop orders"
        indexes = [models.Index(fields=["number"])]

    def __str__(self) -> str:
        return f"#{self.number or self.pk}"

    def set_status(self, new_status: str) -> None:
        """The framework's own state machine: check the pipeline, save, write the history."""
        old_status = self.status
        if new_status not in self.pipeline.get(old_status, ()):
            raise InvalidOrderStatus(f"{old_status!r} cannot become {new_status!r}")
        self.status = new_status
        self.save()
        OrderStatusChange.objects.create(order=self, old_status=old_status,  # type: ignore[misc]
                                         new_status=new_status)


class ShopOrder(AbstractShopOrder, TimeoutOrderMixin):
    """The shop's order with timeouts: its own status field and values, declared to the app.

    ``completes_at``: when a delivered order completes (the end of its return window), a column
    the shop owns, read by its own timer (testproject/shop/timers.py).
    """

    completes_at = models.DateTimeField(null=True, blank=True, db_index=True)

    # Staff build draft orders in the dashboard; the deadline runs once one is placed (Pending).
    TIMEOUT_DRAFT_STATUSES = ("Draft",)
    TIMEOUT_UNPAID_STATUSES = ("Pending",)
    TIMEOUT_PAID_STATUS = "Paid"
    TIMEOUT_CLOSED_STATUS = "Cancelled"

    def timeout_public_name(self) -> str:
        # What its customers and its API call an order: its number, once it has one.
        return self.number or str(self.pk)

    class Meta(AbstractShopOrder.Meta, TimeoutOrderMixin.Meta):
        indexes = [*AbstractShopOrder.Meta.indexes, *TimeoutOrderMixin.Meta.indexes]


class Return(models.Model):
    """A return the customer opened for a delivered order: while it is open the order does not complete."""

    order = models.ForeignKey(ShopOrder, on_delete=models.CASCADE, related_name="returns")
    state = models.CharField(max_length=16, default="open")


class OrderStatusChange(models.Model):
    order = models.ForeignKey(ShopOrder, on_delete=models.CASCADE, related_name="status_changes")
    old_status = models.CharField(max_length=100, blank=True)
    new_status = models.CharField(max_length=100, blank=True)
    date_created = models.DateTimeField(auto_now_add=True)


class StockRecord(models.Model):
    num_in_stock = models.PositiveIntegerField(default=0)
    num_allocated = models.IntegerField(default=0)


class Checkout(models.Model):
    """A checkout in progress: while it is completing, the stock it reserved stays reserved."""

    state = models.CharField(max_length=16, default="open")  # open, completing, completed


class StockReservation(models.Model):
    """Stock held for a checkout for a while: released when it lapses (testproject/shop/timers.py)."""

    stockrecord = models.ForeignKey(StockRecord, on_delete=models.PROTECT, related_name="reservations")
    checkout = models.ForeignKey(Checkout, on_delete=models.CASCADE, related_name="reservations")
    quantity = models.PositiveIntegerField(default=1)
    state = models.CharField(max_length=16, default="held")  # held, released, used
    expires_at = models.DateTimeField(null=True, blank=True)
    released_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        # What the timer's scan walks: the held reservations by deadline.
        indexes = [models.Index(fields=["state", "expires_at"])]


class Line(models.Model):
    """An order line holding stock allocated at checkout, released when the order expires."""

    order = models.ForeignKey(ShopOrder, on_delete=models.CASCADE, related_name="lines")
    stockrecord = models.ForeignKey(StockRecord, on_delete=models.PROTECT, related_name="lines")
    quantity = models.PositiveIntegerField(default=1)


# -- A shop that cannot touch its orders table ------------------------------------
# The deadline lives in a table of its own, one-to-one with the order. The
# consumer closes the deadline row; a receiver moves the order's own status in
# the same transaction (see receivers.cancel_plain_order).


class PlainOrder(models.Model):
    """An orders table the shop cannot migrate (owned by another system, say)."""

    status = models.CharField(max_length=20, default="pending")


class PlainOrderDeadline(AbstractTimeoutOrder):
    order = models.OneToOneField(PlainOrder, on_delete=models.CASCADE, related_name="deadline")


# -- Order models whose keys and managers are not Django's defaults -----------------


class UuidOrder(AbstractTimeoutOrder):
    """A UUID primary key: its members must not depend on how the key was spelled."""

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)


class VisibleOrders(models.Manager):
    def get_queryset(self) -> models.QuerySet:
        return super().get_queryset().filter(hidden=False)


class SoftDeleteOrder(AbstractTimeoutOrder):
    """A default manager that hides rows (soft delete, a tenant scope): the app must still see them."""

    hidden = models.BooleanField(default=False)

    objects = VisibleOrders()
    every = models.Manager()


# -- Payments: started at checkout, confirmed (or not) by the gateway's webhook later ---------


class PaymentState(models.TextChoices):
    PENDING = "pending"  # 3-D Secure, a wallet, a bank transfer: started, not confirmed yet
    SUCCEEDED = "succeeded"
    FAILED = "failed"


class AbstractPayment(models.Model):
    method = models.CharField(max_length=32, default="card")
    state = models.CharField(max_length=16, choices=PaymentState.choices, default=PaymentState.PENDING)
    amount = models.DecimalField(max_digits=12, decimal_places=2, default=Decimal("0"))
    started_at = models.DateTimeField(default=timezone.now)

    class Meta:
        abstract = True


class Payment(AbstractPayment):
    """A payment of the shop's own order."""

    order = models.ForeignKey(ShopOrder, on_delete=models.CASCADE, related_name="payments")


class OrderPayment(AbstractPayment):
    """The same, for the app's ready-made ``Order``: the hold condition reads alike on both."""

    order = models.ForeignKey("order_timeout.Order", on_delete=models.CASCADE, related_name="payments")


class ReminderEmail(models.Model):
    """What the shop's reminder receiver would e-mail: one row per ``deadline_approaching``,
    written in the transaction that sends it (so a row is a reminder that really went out)."""

    model = models.CharField(max_length=100)
    order_id = models.CharField(max_length=64, db_index=True)
    seconds_left = models.FloatField()
    deadline = models.DateTimeField(null=True)
    written_at = models.DateTimeField(auto_now_add=True)
