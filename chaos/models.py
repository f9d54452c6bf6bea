"""What the harness counts with SQL: deliveries of ``order_expired``, each order's role, payments.

Reminders are counted in the test shop's ``ReminderEmail`` (one row per
``deadline_approaching`` delivery, written in the reminder's transaction) and
the app's own ``order_timeout.Reminder``.

Order ids are the order model's integer primary keys (``order_timeout.Order``
and the test shop's ``ShopOrder`` both have one), stored as integers so that
the invariants can join them to the orders table on an index.
"""

from django.db import models
from django.db.models import DateTimeField, Func


class DatabaseUtcNow(Func):
    """The database server's clock (UTC, microseconds): the clock that judged the order due."""

    template = "UTC_TIMESTAMP(6)"
    output_field = DateTimeField()


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


class Settlement(models.Model):
    """How an order's payment in flight ended (what the gateway's webhook said), and when.

    Written in the transaction that changed the payment's state, as its last
    statement: ``settled_at`` is the database's clock just before that commit.
    The order was held until the commit, so no close of it may come before
    ``settled_at``.
    """

    class State(models.TextChoices):
        SUCCEEDED = "succeeded"  # the payment went through: the order is paid in the same transaction
        FAILED = "failed"        # declined, abandoned: the order is no longer held

    order_id = models.BigIntegerField(primary_key=True)
    state = models.CharField(max_length=10, choices=State.choices)
    settled_at = models.DateTimeField()


class Stranded(models.Model):
    """A reminder under lease at the moment the harness killed a consumer.

    Noted right after each SIGKILL: whatever the killed consumer held is still
    leased then (until its lease runs out), so a reminder lost to a kill is
    among these. Others' leases are noted too; that only makes the check weaker.
    """

    order_id = models.BigIntegerField(db_index=True)
    lead_ms = models.BigIntegerField()
    killed_at = models.DateTimeField()
