"""What no receiver asks for is not done (issue 28): a batch nobody takes instances of is closed as keys.

The close builds the model's instances only for a receiver that takes them
(``order_expired``, ``orders_expired``); a declared timer only when it has a
``fire()`` (or a re-check of its own). Otherwise the rows are locked as their
keys and the columns the re-check reads, and every promise holds the same:
a paid row stays paid, a deadline moved later is not acted on, a receiver
of the keys runs in the close's transaction and can refuse it.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta
from typing import Any

import pytest
from django.db import transaction
from django.db.models import Count, Q
from django.utils import timezone

from order_timeout import timers
from order_timeout.consumer import Consumer
from order_timeout.models import Order, Reminder
from order_timeout.signals import deadline_approaching, order_expired, order_keys_expired, orders_expired
from order_timeout.timers import registry
from order_timeout.timers.closes import OrderTimeout
from order_timeout.timers.registry import REMINDERS
from testproject.shop.models import Checkout, OrderPayment, Payment, ShopOrder, StockRecord, StockReservation

from .conftest import both_models, running, wait_for
from .helpers import state
from .test_consumer import no_receivers

pytestmark = pytest.mark.django_db(transaction=True)


@contextmanager
def instances_built(model: Any) -> Iterator[list[Any]]:
    """Every instance of ``model`` read from the database while inside (``from_db``)."""
    built: list[Any] = []
    inherited = model.from_db  # bound to the model: the model's own way, whichever class has it
    assert "from_db" not in model.__dict__

    def counting(cls: Any, *args: Any, **kwargs: Any) -> Any:
        instance = inherited(*args, **kwargs)
        built.append(instance)
        return instance

    model.from_db = classmethod(counting)
    try:
        yield built
    finally:
        del model.from_db


@contextmanager
def connected(signal: Any, func: Any) -> Iterator[None]:
    signal.connect(func, weak=False)
    try:
        yield
    finally:
        signal.disconnect(func)


def test_a_batch_no_receiver_takes_is_closed_without_building_an_instance(consumer, make_order):
    orders = [make_order(in_seconds=-1) for _ in range(4)]

    with no_receivers(order_expired, orders_expired), instances_built(Order) as built:
        stats = consumer().run(once=True)

    assert (stats.closed, stats.failed) == (4, 0)
    assert built == []
    closed = Order.objects.filter(pk__in=[order.pk for order in orders])
    assert {(order.status, order.close_reason) for order in closed} == {("closed", "timeout")}
    assert all(order.closed_at is not None for order in closed)


def test_a_per_order_receiver_gets_the_orders_as_instances_again(consumer, make_order, receiver):
    orders = [make_order(in_seconds=-1) for _ in range(2)]
    heard: list[Any] = []
    with no_receivers(order_expired, orders_expired):
        receiver(lambda sender, order, **kwargs: heard.append((order.pk, order.status)))
        with instances_built(Order) as built:
            consumer().run(once=True)

    assert sorted(heard) == sorted((order.pk, "closed") for order in orders)
    assert len(built) == 2


def test_an_order_paid_behind_the_queues_back_in_a_batch_of_keys_stays_paid(consumer, make_order):
    due, paid = make_order(in_seconds=-1), make_order(in_seconds=-1)
    # Paid by an UPDATE that tells Redis nothing: its member is still due there.
    Order.objects.filter(pk=paid.pk).update(status="paid")

    with no_receivers(order_expired, orders_expired):
        stats = consumer().run(once=True)

    assert (state(due), state(paid)) == ("closed", "paid")
    assert (stats.closed, stats.skipped_paid) == (1, 1)


def test_a_deadline_moved_later_behind_the_queues_back_is_not_closed_from_a_batch_of_keys(
        consumer, make_order, clock):
    moved = make_order(in_seconds=-1)
    Order.objects.filter(pk=moved.pk).update(expires_at=clock() + timedelta(hours=1))

    with no_receivers(order_expired, orders_expired):
        stats = consumer().run(once=True)

    assert state(moved) == "unpaid"
    assert (stats.closed, stats.rescheduled) == (0, 1)


def test_order_keys_expired_hears_each_closed_key_and_its_reason_inside_the_close(consumer, make_order):
    orders = [make_order(in_seconds=-1) for _ in range(3)]
    heard: list[tuple[list[Any], dict[Any, str], bool, list[str]]] = []

    def record(sender: Any, keys: list[Any], reasons: dict[Any, str], **kwargs: Any) -> None:
        statuses = list(Order.objects.filter(pk__in=keys).values_list("status", flat=True))
        heard.append((keys, reasons, transaction.get_connection().in_atomic_block, statuses))

    with no_receivers(order_expired, orders_expired), connected(order_keys_expired, record), \
            instances_built(Order) as built:
        consumer().run(once=True)

    pks = sorted(order.pk for order in orders)
    assert [(sorted(keys), reasons, inside, statuses) for keys, reasons, inside, statuses in heard] == [
        (pks, dict.fromkeys(pks, "timeout"), True, ["closed"] * 3)]
    assert built == []


def test_a_refusing_order_keys_expired_receiver_leaves_its_orders_open_for_another_try(consumer, make_order):
    orders = [make_order(in_seconds=-1) for _ in range(2)]

    def refuse(sender: Any, keys: list[Any], **kwargs: Any) -> None:
        raise RuntimeError("the audit log is down")

    with no_receivers(order_expired, orders_expired), connected(order_keys_expired, refuse):
        stats = consumer().run(once=True)

    assert [state(order) for order in orders] == ["unpaid", "unpaid"]
    assert (stats.closed, stats.failed) == (0, 2)


def test_the_close_asks_for_instances_only_while_a_receiver_takes_them():
    kind = OrderTimeout(Order)
    with no_receivers(order_expired, orders_expired):
        lean = kind.takes_instances()

        def listen(sender: Any, **kwargs: Any) -> None:
            pass

        with connected(orders_expired, listen):
            batch = kind.takes_instances()
        with connected(order_keys_expired, listen):
            keys_only = kind.takes_instances()

    assert (lean, batch, keys_only) == (False, True, False)


# -- a declared timer ---------------------------------------------------------------------------


class LapsesByValues(timers.Timer):
    """A timer of ``values`` alone: nothing takes its rows."""

    name = "lapses-by-values"
    deadline = "expires_at"
    pending = Q(state="held")
    values = {"state": "released", "released_at": timers.NOW}


class LapsesWithFire(LapsesByValues):
    name = "lapses-with-fire"
    fired: list[tuple[Any, str]] = []

    def fire(self, rows: list[Any], now: Any) -> None:
        type(self).fired += [(row.pk, row.state) for row in rows]


@pytest.fixture
def lapsing(redis_client: Any, request: pytest.FixtureRequest) -> Iterator[Any]:
    registry.register(StockReservation, request.param)
    try:
        yield registry.get(request.param.name)
    finally:
        registry.unregister(request.param.name)


def _due_reservations(count: int) -> list[StockReservation]:
    stock = StockRecord.objects.create(num_in_stock=100, num_allocated=0)
    checkout = Checkout.objects.create()
    past = timezone.now() - timedelta(seconds=5)
    made = [StockReservation.objects.create(stockrecord=stock, checkout=checkout, quantity=1, state="held",
                                            expires_at=past) for _ in range(count)]
    # One that another process settled behind the queue's back: never acted on.
    StockReservation.objects.filter(pk=made[-1].pk).update(state="used")
    return made


@pytest.mark.parametrize("lapsing", [LapsesByValues], indirect=True)
def test_a_timer_of_values_alone_acts_without_building_an_instance(consumer, lapsing):
    made = _due_reservations(3)

    with instances_built(StockReservation) as built:
        stats = consumer(kinds=[lapsing]).run(once=True)

    assert built == []
    states = dict(StockReservation.objects.filter(pk__in=[row.pk for row in made]).values_list("pk", "state"))
    assert [states[row.pk] for row in made] == ["released", "released", "used"]
    assert StockReservation.objects.get(pk=made[0].pk).released_at is not None
    assert stats.of(lapsing.name).acted == 2


@pytest.mark.parametrize("lapsing", [LapsesWithFire], indirect=True)
def test_a_timer_with_fire_gets_its_rows_as_instances_with_its_values_applied(consumer, lapsing):
    made = _due_reservations(3)
    LapsesWithFire.fired = []

    consumer(kinds=[lapsing]).run(once=True)

    assert sorted(LapsesWithFire.fired) == [(made[0].pk, "released"), (made[1].pk, "released")]


# -- the reminders: recorded from the keys when nobody listens to deadline_approaching -----------


@pytest.fixture
def two_reminders(settings: Any) -> Iterator[None]:
    """Reminders 60 s and 45 s before the deadline, and no receiver of ``deadline_approaching``."""
    settings.ORDER_TIMEOUT = {**settings.ORDER_TIMEOUT, "REMINDERS": [60, 45]}
    with no_receivers(deadline_approaching):
        yield


def records(order: Any) -> list[tuple[int, str]]:
    return sorted(Reminder.objects.filter(order_id=str(order.pk)).values_list("lead_ms", "outcome"))


@both_models
def test_reminders_nobody_listens_to_are_recorded_once_from_the_keys_without_an_instance(
        two_reminders, consumer, order_model):
    order = order_model.objects.create(expires_at=timezone.now() + timedelta(seconds=30))

    with instances_built(order_model) as built:
        first = consumer(kinds=[REMINDERS]).run(once=True)
        again = consumer(kinds=[REMINDERS]).run(once=True)

    assert (first.reminders.sent, again.reminders.sent) == (2, 0)
    assert built == []
    assert records(order) == [(45_000, "sent"), (60_000, "sent")]
    assert state(order) == "unpaid"


@both_models
def test_no_reminder_is_recorded_sent_for_an_order_paid_closed_or_past_its_deadline_from_the_keys(
        two_reminders, consumer, order_model):
    paid, closed = (order_model.objects.create(expires_at=timezone.now() + timedelta(seconds=30))
                    for _ in range(2))
    order_model.objects.create(expires_at=timezone.now() + timedelta(seconds=0.3))  # its deadline passes first
    # Behind the queue's back, as a payment whose ZREM was lost: the row says so under its lock.
    order_model._base_manager.filter(pk=paid.pk).update(**{order_model.TIMEOUT_STATUS_FIELD: "paid"})
    order_model._base_manager.filter(pk=closed.pk).update(
        **{order_model.TIMEOUT_STATUS_FIELD: order_model.TIMEOUT_CLOSED_STATUS})
    time.sleep(0.4)

    stats = consumer(kinds=[REMINDERS]).run(once=True)

    assert stats.reminders.sent == 0 and stats.reminders.done == 6
    assert Reminder.objects.count() == 0


@both_models
def test_a_reminder_of_an_order_whose_payment_is_in_flight_is_recorded_passed_over_from_the_keys(
        two_reminders, consumer, settings, order_model):
    settings.ORDER_TIMEOUT = {**settings.ORDER_TIMEOUT, "HOLD_CONDITION": Q(payments__state="pending")}
    order = order_model.objects.create(expires_at=timezone.now() + timedelta(seconds=30))
    (Payment if order_model is ShopOrder else OrderPayment).objects.create(order=order)

    stats = consumer(kinds=[REMINDERS]).run(once=True)

    assert (stats.reminders.sent, stats.reminders.held) == (0, 2)
    assert records(order) == [(45_000, "held"), (60_000, "held")]


def test_three_consumers_record_each_reminder_nobody_listens_to_once(two_reminders):
    orders = [Order.objects.create(expires_at=timezone.now() + timedelta(seconds=30)) for _ in range(60)]
    workers = [Consumer(batch_size=7, kinds=[REMINDERS]) for _ in range(3)]

    with running(workers[0]), running(workers[1]), running(workers[2]):
        wait_for(lambda: Reminder.objects.count() >= 120, timeout=60)

    assert sum(worker.stats.reminders.sent for worker in workers) == 120
    assert Reminder.objects.filter(outcome="sent").count() == 120
    assert not Reminder.objects.values("order_id", "lead_ms").annotate(n=Count("id")).filter(n__gt=1).exists()
    assert {int(pk) for pk in Reminder.objects.values_list("order_id", flat=True)} == {o.pk for o in orders}


def test_a_row_whose_deadline_the_apps_table_no_longer_holds_is_not_acted_on_from_a_batch_of_keys(consumer):
    """A timer whose deadlines live in the app's table, read as keys (no fire()): a row whose
    deadline row went behind the queue's back (its member left in Redis) is settled, not acted
    on, though every other row of its batch is due."""
    from order_timeout.models import Deadline
    from testproject.shop.models import PlainOrder

    timer = registry.get("plain-order-payment")
    orders = list(PlainOrder.objects.bulk_create([PlainOrder() for _ in range(3)]))
    for order in orders:
        timer.set_deadline(order, timezone.now() - timedelta(seconds=5))
    Deadline.objects.filter(timer=timer.name, object_id=str(orders[1].pk)).delete()

    stats = consumer(kinds=[timer]).run(once=True)

    statuses = dict(PlainOrder.objects.values_list("pk", "status"))
    assert [statuses[order.pk] for order in orders] == ["cancelled", "pending", "cancelled"]
    assert stats.of(timer.name).acted == 2
