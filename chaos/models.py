"""What the harness counts with SQL: deliveries of ``order_expired``, each order's role, payments.

Reminders are counted in the test shop's ``ReminderEmail`` (one row per
``deadline_approaching`` delivery, written in the reminder's transaction) and
the app's own ``order_timeout.Reminder``.

Order ids are the order model's integer primary keys (``order_timeout.Order``
and the test shop's ``ShopOrder`` both have one), stored as integers so that
the invariants can join them to the orders table on an index.
"""

from typing import Any

from django.db import models
from django.db.models import DateTimeField, Func


class DatabaseUtcNow(Func):
    """The database server's clock (UTC, microseconds): the clock that judged the order due."""

    template = "UTC_TIMESTAMP(6)"
    output_field = DateTimeField()

    def as_postgresql(self, compiler: Any, connection: Any, **extra_context: Any) -> Any:
        """PostgreSQL's clock as it reads now (not now(): the transaction's start), for the soak."""
        return self.as_sql(compiler, connection, template="clock_timestamp()", **extra_context)


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


# -- the shop's declared timers (the every-kind scenario) ---------------------------------------


class TimerRole(models.Model):
    """Which cohort a row of a declared timer's model is counted in, and the deadline it was given
    (a ``PlainOrder``'s lives in the app's ``Deadline`` table, which its act deletes)."""

    timer = models.CharField(max_length=64)
    object_id = models.BigIntegerField()
    cohort = models.CharField(max_length=60, db_index=True)
    deadline = models.DateTimeField()

    class Meta:
        constraints = [models.UniqueConstraint(fields=["timer", "object_id"], name="chaos_timerrole_once")]


class ShopMove(models.Model):
    """What the harness did to such a row as the shop would, and what came of it.

    Written as the last statement of the move's own transaction: ``at`` is the database's
    clock just before that commit.
    """

    class Move(models.TextChoices):
        COMPLETING = "completing"  # its checkout started completing: the reservation is held
        COMPLETED = "completed"    # the checkout completed: the reservation used, under its row lock
        ABANDONED = "abandoned"    # the checkout gave up completing: the reservation may lapse
        RETURNED = "returned"      # a return opened for a delivered order, under the order's lock
        PAID = "paid"              # a PlainOrder saved as paid, its deadline taken away
        REFUSED = "refused"        # that save raised OrderClosed: the order was cancelled already
        TOO_LATE = "too late"      # completing, completed or returned found the row acted on already

    timer = models.CharField(max_length=64)
    object_id = models.BigIntegerField(db_index=True)
    move = models.CharField(max_length=12, choices=Move.choices)
    at = models.DateTimeField()


class Act(models.Model):
    """One act of a declared timer that committed: written by a trigger on the row's UPDATE
    (migration 0003), so inside the act's transaction, with the database's clock.

    Only the act moves a row so (reservation held -> released, order Delivered -> Complete,
    PlainOrder pending -> cancelled): two rows for one object are two acts that committed.
    """

    timer = models.CharField(max_length=64)
    object_id = models.BigIntegerField()
    acted_at = models.DateTimeField()

    class Meta:
        indexes = [models.Index(fields=["timer", "object_id"])]
