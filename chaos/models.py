"""What the harness counts with SQL: deliveries of ``order_expired``, each order's role, payments.

Order ids are the order model's integer primary keys (``order_timeout.Order``
and the test shop's ``ShopOrder`` both have one), stored as integers so that
the invariants can join them to the orders table on an index.
"""

from django.db import models


class Delivery(models.Model):
    """One ``order_expired`` delivery, written inside the closing transaction.

    It commits with the close or not at all, so two rows for one order mean
    a close committed twice. ``delivered_at`` is the database's clock, the
    one that judged the order due; the commit follows within the batch.
    """

    order_id = models.BigIntegerField(db_index=True)
    delivered_at = models.DateTimeField()
    pid = models.IntegerField()


class Role(models.Model):
    """Which cohort an order is counted in, and how its receiver misbehaves."""

    class Behaviour(models.TextChoices):
        NONE = ""
        RAISE = "raise"                  # raises on every delivery
        FLAKY = "flaky"                  # raises on some deliveries (CHAOS_FLAKY_RATE)
        HANG = "hang"                    # sleeps CHAOS_HANG_SECONDS, far past LEASE_SECONDS
        OVERRUN = "overrun"              # sleeps CHAOS_OVERRUN_SECONDS, just over LEASE_SECONDS
        EXIT = "exit"                    # os._exit(): takes its process down mid-transaction
        PAUSE_AFTER_CLAIM = "pause_claim"  # its consumer SIGSTOPs itself before locking the rows
        PAUSE_IN_CLOSE = "pause_close"     # its consumer SIGSTOPs itself inside the closing transaction

    order_id = models.BigIntegerField(primary_key=True)
    cohort = models.CharField(max_length=40, db_index=True)
    behaviour = models.CharField(max_length=20, blank=True, default="", choices=Behaviour.choices)


class Payment(models.Model):
    """What ``mark_paid()`` answered the harness for one order."""

    class Outcome(models.TextChoices):
        PAID = "paid"          # returned True: the payment's UPDATE committed
        REFUND = "refund"      # raised OrderClosed: the deadline won, the payment is refunded
        SETTLED = "settled"    # returned False: settled otherwise already

    order_id = models.BigIntegerField(primary_key=True)
    outcome = models.CharField(max_length=10, choices=Outcome.choices)
    answered_at = models.DateTimeField()
