from django.db import models

from order_timeout.models import AbstractTimeoutOrder


class Expiry(models.Model):
    """One row per ``order_expired`` delivery: what a shop's stock release would write.

    Committed with the close, so counting rows counts closes that really happened.
    """

    order_id = models.CharField(max_length=64, db_index=True)
    model = models.CharField(max_length=100)
    delivered_at = models.DateTimeField(auto_now_add=True)


class Purchase(AbstractTimeoutOrder):
    """A shop's own order model, plugged in through ORDER_TIMEOUT['ORDER_MODEL']."""

    customer = models.CharField(max_length=100, blank=True)
