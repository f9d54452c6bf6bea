"""What a batch costs in round trips to the database, counted on the wire (bench/roundtrips.py).

A plain close takes two: BEGIN with the locking SELECT, the UPDATE with COMMIT
(db/two_trips.py); a hold read after the lock rides the first, as do the
reminders a batch of reminders reads, and what they record rides the second.
A batch that runs the shop's code keeps Django's ``atomic``, and so does a
batch inside a test's transaction (order_timeout.testing), with every promise.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
from django.db import connection, transaction
from django.db.models import Q
from django.utils import timezone

from bench.roundtrips import RoundTrips
from order_timeout.consumer import Consumer
from order_timeout.models import Order, Reminder
from order_timeout.signals import deadline_approaching, order_expired, orders_expired
from order_timeout.timers.closes import OrderTimeout
from order_timeout.timers.registry import ORDER_TIMEOUT, REMINDERS
from testproject.shop.models import OrderPayment, Payment, PaymentState, ShopOrder

from .conftest import both_models
from .helpers import expiries, state
from .test_consumer import no_receivers

pytestmark = pytest.mark.django_db(transaction=True)

# The promise the issue fixed: a plain batch, at most this many round trips to the database.
MOST_FOR_A_PLAIN_BATCH = 3


@pytest.fixture
def database_trips() -> Iterator[RoundTrips]:
    """The test's database connection through a proxy that counts its round trips."""
    kept = dict(connection.settings_dict)
    connection.close()
    with RoundTrips(kept["HOST"] or "127.0.0.1", int(kept["PORT"])) as trips:
        connection.settings_dict.update(HOST="127.0.0.1", PORT=str(trips.port))
        try:
            yield trips
        finally:
            connection.close()
            connection.settings_dict.update(HOST=kept["HOST"], PORT=kept["PORT"])


@pytest.fixture
def holds(settings):
    settings.ORDER_TIMEOUT = {**settings.ORDER_TIMEOUT, "HOLD_CONDITION": Q(payments__state="pending")}


def round_trips_per_batch(worker: Consumer, trips: RoundTrips, batches: int) -> list[int]:
    """The database round trips of each of ``batches`` batches (the claim is Redis's), after one
    batch that compiles the statements a process compiles once."""
    worker.pauses.load()
    worker._pauses_loaded = True
    counted = []
    for number in range(batches + 1):
        claim = worker.claim(worker.clock())
        assert claim.members
        trips.reset()
        worker.process(claim, worker.clock())
        if number:
            counted.append(trips.reset())
    worker.flush_acks()
    return counted


def due_orders(model, count: int) -> list:
    return [model.objects.create(expires_at=timezone.now() - timedelta(seconds=1)) for _ in range(count)]


@both_models
def test_a_plain_batch_takes_two_round_trips_to_the_database(order_model, database_trips, queue):
    orders = due_orders(order_model, 30)
    with no_receivers(order_expired, orders_expired):
        counted = round_trips_per_batch(Consumer(batch_size=10, kinds=[ORDER_TIMEOUT]), database_trips, 2)

    assert counted == [2, 2] and max(counted) <= MOST_FOR_A_PLAIN_BATCH
    assert [state(order) for order in orders] == ["closed"] * 30
    assert {expiries(order) for order in orders} <= {0, 1}  # no receiver: nothing recorded, closed once


@both_models
def test_a_batch_with_a_held_tenth_takes_no_round_trip_more_than_a_plain_one(
        order_model, holds, database_trips, queue):
    orders = due_orders(order_model, 30)
    payment = Payment if order_model is ShopOrder else OrderPayment
    for order in orders[::10]:
        payment.objects.create(order=order, state=PaymentState.PENDING)
    with no_receivers(order_expired, orders_expired):
        counted = round_trips_per_batch(Consumer(batch_size=10, kinds=[ORDER_TIMEOUT]), database_trips, 2)

    assert counted == [2, 2]
    assert [state(order) for order in orders[::10]] == ["unpaid"] * 3
    assert [state(order) for index, order in enumerate(orders) if index % 10] == ["closed"] * 27


def test_a_batch_of_reminders_takes_no_round_trip_more_than_a_plain_close(settings, database_trips, queue):
    settings.ORDER_TIMEOUT = {**settings.ORDER_TIMEOUT, "REMINDERS": [60]}
    orders = [Order.objects.create(expires_at=timezone.now() + timedelta(seconds=30)) for _ in range(30)]
    with no_receivers(deadline_approaching):
        counted = round_trips_per_batch(Consumer(batch_size=10, kinds=[REMINDERS]), database_trips, 2)

    assert counted == [2, 2]
    assert Reminder.objects.filter(order_id__in=[str(order.pk) for order in orders], outcome="sent").count() == 30
    assert [state(order) for order in orders] == ["unpaid"] * 30


def test_a_batch_whose_receivers_run_keeps_djangos_atomic(database_trips, queue, receiver):
    """The shop's code may ask Django about its transaction (on_commit, a savepoint): it gets one."""
    seen = []
    receiver(lambda sender, order, **kwargs: seen.append(connection.in_atomic_block))
    orders = due_orders(Order, 30)

    counted = round_trips_per_batch(Consumer(batch_size=10, kinds=[ORDER_TIMEOUT]), database_trips, 2)

    assert seen == [True] * 30 and all(count > 2 for count in counted)
    assert [state(order) for order in orders] == ["closed"] * 30


def test_a_batch_inside_a_callers_transaction_keeps_it(queue):
    """order_timeout.testing's runner acts inside a test's transaction: the batch is part of it."""
    orders = due_orders(Order, 3)
    with no_receivers(order_expired, orders_expired), transaction.atomic():
        Consumer(kinds=[ORDER_TIMEOUT]).drain(timezone.now)
        assert connection.in_atomic_block
        transaction.set_rollback(True)

    assert [state(order) for order in orders] == ["unpaid"] * 3  # rolled back with the caller's


def between_the_two_trips_once(monkeypatch, harm) -> list:
    """``harm()`` once, in the first batch, between its reads and its writes (where the close hands
    its keys on); the keys that batch held, sorted."""
    real_send_keys = OrderTimeout._send_keys
    harmed: list = []

    def once(model, reasons):
        if not harmed:
            harmed.append(sorted(reasons))
            harm()
        real_send_keys(model, reasons)

    monkeypatch.setattr(OrderTimeout, "_send_keys", staticmethod(once))
    return harmed


def closed_with_no_receiver() -> Any:
    with no_receivers(order_expired, orders_expired):
        return Consumer(kinds=[ORDER_TIMEOUT]).run(once=True)


def test_a_failure_between_the_two_trips_rolls_back_and_the_batch_is_closed_once_key_by_key(
        queue, monkeypatch):
    orders = due_orders(Order, 4)

    def a_bug() -> None:
        raise RuntimeError("a bug between the reads and the writes")

    failures = between_the_two_trips_once(monkeypatch, a_bug)
    stats = closed_with_no_receiver()

    assert failures == [sorted(order.pk for order in orders)]
    assert stats.closed == 4 and [state(order) for order in orders] == ["closed"] * 4
    assert not in_a_transaction()


def in_a_transaction() -> bool:
    """Whether the session has a transaction open (none should be left between batches)."""
    with connection.cursor() as cursor:
        if connection.vendor == "mysql":
            cursor.execute("SELECT @@in_transaction")
            return bool(cursor.fetchone()[0])
        return connection.connection.info.transaction_status != 0  # psycopg's IDLE


def test_a_connection_lost_between_the_two_trips_loses_nothing_and_closes_each_order_once(
        queue, monkeypatch, caplog):
    orders = due_orders(Order, 4)
    # The driver's connection closed: the server rolls the transaction back.
    lost = between_the_two_trips_once(monkeypatch, lambda: connection.connection.close())
    stats = closed_with_no_receiver()

    assert lost == [sorted(order.pk for order in orders)]
    assert "Could not roll back a batch's transaction" in caplog.text
    assert stats.closed == 4 and [state(order) for order in orders] == ["closed"] * 4
    assert not in_a_transaction()
