"""Saleor's order, the parts the expiry reads and writes (saleor/order/models.py, saleor/channel)."""

import uuid
from decimal import Decimal

from django.db import models
from django.utils import timezone


class OrderStatus(models.TextChoices):
    DRAFT = "draft"
    UNCONFIRMED = "unconfirmed"
    UNFULFILLED = "unfulfilled"
    PARTIALLY_FULFILLED = "partially fulfilled"
    FULFILLED = "fulfilled"
    CANCELED = "canceled"
    EXPIRED = "expired"


class OrderChargeStatus(models.TextChoices):
    NONE = "none"
    PARTIAL = "partial"
    FULL = "full"
    OVERCHARGED = "overcharged"


class Channel(models.Model):
    slug = models.SlugField(unique=True)
    # Minutes an unconfirmed order may wait for its payment; None or 0: it never expires.
    expire_orders_after = models.IntegerField(null=True, blank=True)


class Order(models.Model):
    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    created_at = models.DateTimeField(default=timezone.now, editable=False)
    updated_at = models.DateTimeField(auto_now=True)
    expired_at = models.DateTimeField(null=True, blank=True)
    status = models.CharField(max_length=32, default=OrderStatus.UNFULFILLED, choices=OrderStatus.choices)
    charge_status = models.CharField(max_length=32, default=OrderChargeStatus.NONE,
                                     choices=OrderChargeStatus.choices)
    channel = models.ForeignKey(Channel, related_name="orders", on_delete=models.PROTECT)
    voucher_code = models.CharField(max_length=255, null=True, blank=True)

    class Meta:
        ordering = ("-created_at",)


class Stock(models.Model):
    quantity = models.IntegerField(default=0)
    quantity_allocated = models.IntegerField(default=0)


class Allocation(models.Model):
    order = models.ForeignKey(Order, related_name="allocations", on_delete=models.CASCADE)
    stock = models.ForeignKey(Stock, related_name="allocations", on_delete=models.CASCADE)
    quantity_allocated = models.PositiveIntegerField(default=0)


class VoucherCode(models.Model):
    code = models.CharField(max_length=255, unique=True)
    used = models.PositiveIntegerField(default=0)


class OrderEvent(models.Model):
    order = models.ForeignKey(Order, related_name="events", on_delete=models.CASCADE)
    type = models.CharField(max_length=255)
    date = models.DateTimeField(default=timezone.now)


class TransactionItem(models.Model):
    """A payment app's transaction: money authorized or charged, or on its way."""

    order = models.ForeignKey(Order, related_name="payment_transactions", null=True, on_delete=models.SET_NULL)
    authorize_pending_value = models.DecimalField(max_digits=12, decimal_places=3, default=Decimal(0))
    charge_pending_value = models.DecimalField(max_digits=12, decimal_places=3, default=Decimal(0))
    charged_value = models.DecimalField(max_digits=12, decimal_places=3, default=Decimal(0))


class Payment(models.Model):
    """The older payment API: a payment gateway's charge."""

    order = models.ForeignKey(Order, related_name="payments", null=True, on_delete=models.SET_NULL)
    is_active = models.BooleanField(default=True)
    charge_status = models.CharField(max_length=20, default="not-charged")  # pending, fully-charged, ...


class TransactionEvent(models.Model):
    """An event of a transaction (Saleor's ``TransactionEvent``): here, the refund a shop requests."""

    transaction = models.ForeignKey(TransactionItem, related_name="events", on_delete=models.CASCADE)
    type = models.CharField(max_length=128)  # "refund_request", as Saleor's TransactionEventType.REFUND_REQUEST
    amount_value = models.DecimalField(max_digits=12, decimal_places=3, default=Decimal(0))
