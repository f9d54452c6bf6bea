"""A payment in flight holds its order past the deadline: never refused while the shop's data says so.

The shop's payments table (``testproject.shop``) has pending, succeeded and
failed payments; ``HOLD_CONDITION`` is ``Q(payments__state="pending")`` on
either order model.
"""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.db import connection
from django.db.models import Q
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from order_timeout.conf import settings as order_settings
from order_timeout.models import Order
from order_timeout.reporting.health import measure
from order_timeout.scans.compensation import compensate
from order_timeout.signals import order_expired, orders_expired
from order_timeout.timers.members import now_score
from testproject.shop.models import OrderPayment, Payment, PaymentState, ShopOrder

from . import test_round_trips as round_trips
from .conftest import both_models
from .helpers import count_in, expiries, leased_members, pending_count, score_of, state
from .holding import row_locked_elsewhere
from .test_consumer import no_receivers

pytestmark = pytest.mark.django_db(transaction=True)

RECHECK = 30
# The test's database connection through a proxy that counts its round trips.
database_trips = round_trips.database_trips


@pytest.fixture
def holds(settings):
    settings.ORDER_TIMEOUT = {**settings.ORDER_TIMEOUT, "HOLD_CONDITION": Q(payments__state="pending"),
                              "HOLD_RECHECK": RECHECK}


def start_payment(order, state=PaymentState.PENDING):
    """The customer started paying: a payment row, pending until the gateway's webhook says."""
    kind = Payment if isinstance(order, ShopOrder) else OrderPayment
    return kind.objects.create(order=order, state=state)


def settle_payment(payment, state):
    type(payment).objects.filter(pk=payment.pk).update(state=state)


@both_models
def test_an_order_whose_payment_is_pending_at_its_deadline_is_held_not_closed(
        holds, make_order, order_model, consumer, queue, clock):
    order = make_order(in_seconds=-1)
    start_payment(order)

    stats = consumer().run(once=True)

    assert state(order) == "unpaid" and expiries(order) == 0
    assert (stats.closed, stats.held) == (0, 1)
    assert score_of(queue, str(order.pk)) == now_score(clock()) + RECHECK * 1000
    health = measure(model=order_model, drift=False)
    assert (health.held, health.overdue_unpaid_in_database) == (1, 0)


@both_models
def test_a_pending_payment_whose_row_a_webhook_has_locked_still_holds_its_order(
        holds, make_order, order_model, consumer):
    """The webhook's transaction has locked the payment row (to confirm it) but not the order
    yet: the locking SELECT skips locked rows, and must not skip the payment row it reads in
    its hold subquery, or the order closes and the confirmation a moment later is refused."""
    order = make_order(in_seconds=-1)
    payment = start_payment(order)

    with row_locked_elsewhere(type(payment), payment.pk):
        stats = consumer().run(once=True)

    assert state(order) == "unpaid" and expiries(order) == 0
    assert (stats.closed, stats.held) == (0, 1)


@both_models
def test_a_held_order_whose_payment_failed_is_closed_at_the_next_look(
        holds, make_order, order_model, consumer, queue, clock):
    order = make_order(in_seconds=-1)
    payment = start_payment(order)
    worker = consumer()
    worker.run(once=True)

    settle_payment(payment, PaymentState.FAILED)
    clock.advance(RECHECK - 1)
    assert worker.run(once=True).closed == 0  # not looked at again before HOLD_RECHECK
    clock.advance(1)
    stats = worker.run(once=True)

    assert stats.closed == 1 and state(order) == "closed" and expiries(order) == 1
    assert order_model._base_manager.get(pk=order.pk).close_reason == "timeout"
    assert pending_count(queue) == 0 and leased_members(queue) == []
    assert measure(model=order_model, drift=False).held == 0


@both_models
def test_a_held_order_whose_payment_succeeded_is_paid_and_never_closed(
        holds, make_order, order_model, consumer, queue, clock):
    """The webhook comes after the deadline: the payment is taken, not refunded."""
    order = make_order(in_seconds=-1)
    payment = start_payment(order)
    worker = consumer()
    worker.run(once=True)

    settle_payment(payment, PaymentState.SUCCEEDED)
    paid = order_model.objects.get(pk=order.pk).mark_paid()
    clock.advance(RECHECK)
    worker.run(once=True)

    assert paid is True and state(order) == "paid" and expiries(order) == 0
    assert pending_count(queue) == 0 and leased_members(queue) == []


@both_models
def test_a_hold_past_max_hold_closes_the_order_with_its_own_reason(
        holds, settings, order_model, consumer):
    settings.ORDER_TIMEOUT = {**settings.ORDER_TIMEOUT, "MAX_HOLD": 3600}
    late = order_model.objects.create(expires_at=timezone.now() - timedelta(hours=2))
    recent = order_model.objects.create(expires_at=timezone.now() - timedelta(minutes=30))
    for order in (late, recent):
        start_payment(order)

    stats = consumer().run(once=True)

    assert (stats.closed, stats.held) == (1, 1)
    assert state(late) == "closed" and state(recent) == "unpaid"
    assert order_model._base_manager.get(pk=late.pk).close_reason == "hold_expired"


def test_without_max_hold_a_payment_pending_for_days_keeps_holding(holds, settings, consumer):
    settings.ORDER_TIMEOUT = {**settings.ORDER_TIMEOUT, "MAX_HOLD": None}
    order = Order.objects.create(expires_at=timezone.now() - timedelta(days=30))
    start_payment(order)

    assert consumer().run(once=True).held == 1
    assert state(order) == "unpaid"


def test_a_held_order_is_looked_at_again_no_later_than_its_max_hold(holds, settings, consumer, queue, clock):
    settings.ORDER_TIMEOUT = {**settings.ORDER_TIMEOUT, "MAX_HOLD": 3600}
    deadline = timezone.now() - timedelta(seconds=3600 - 10)
    order = Order.objects.create(expires_at=deadline)
    start_payment(order)

    consumer().run(once=True)

    assert score_of(queue, str(order.pk)) <= now_score(deadline + timedelta(seconds=3600)) + 1


def test_the_hold_condition_costs_one_statement_per_batch_not_one_per_order(holds, settings, consumer, clock):
    """A batch with holds takes one SELECT more than a batch without (which of the locked rows are
    held: one set-based statement), whatever the batch's size, and still one locking SELECT."""
    def batch_statements(hold_condition, size) -> list[str]:
        settings.ORDER_TIMEOUT = {**settings.ORDER_TIMEOUT, "HOLD_CONDITION": hold_condition}
        # Due by the consumer's clock (the test's), however long the batches before took.
        orders = [Order.objects.create(expires_at=clock() - timedelta(seconds=1)) for _ in range(size)]
        for order in orders[::2]:
            start_payment(order)
        with CaptureQueriesContext(connection) as queries:
            consumer(batch_size=size).run(once=True)
        # The shop's receiver writes a row per close: not ours to count. (On PostgreSQL the
        # session limits are set with SELECT set_config(), outside the batch.)
        # Statements sent together in one query (db/together.py, db/two_trips.py) counted each.
        return [statement.split()[0].upper() + (" FOR UPDATE" if "FOR UPDATE" in statement else "")
                for query in queries.captured_queries if "shop_expiry" not in query["sql"]
                for statement in query["sql"].split("; ")]

    with_holds, with_holds_small = batch_statements(Q(payments__state="pending"), 40), \
        batch_statements(Q(payments__state="pending"), 6)
    without = batch_statements(None, 40)

    assert with_holds == with_holds_small, (with_holds, with_holds_small)
    assert sorted(with_holds) == sorted([*without, "SELECT"]), (with_holds, without)
    assert with_holds.count("SELECT FOR UPDATE") == 1


def test_a_batch_whose_rows_are_all_locked_elsewhere_costs_no_round_trip_for_its_hold(
        holds, make_order, consumer, clock, database_trips, settings):
    """Seen in the benchmark's reminders row: a batch all busy (locked by another consumer's close)
    still asked its conditions, a statement and a round trip for nothing. Where the conditions go
    with the locking SELECT (in its query, or its pipeline) they cost no round trip of their own;
    where each is a trip of its own, they are not asked of a batch that locked nothing."""
    order = make_order(in_seconds=-1)
    start_payment(order)

    def round_trips(hold_condition) -> int:
        settings.ORDER_TIMEOUT = {**settings.ORDER_TIMEOUT, "HOLD_CONDITION": hold_condition}
        worker = consumer()
        database_trips.reset()
        stats = worker.run(once=True)
        assert (stats.held, stats.closed, stats.rescheduled) == (0, 0, 1) and state(order) == "unpaid"
        clock.advance(2)  # the busy member's next look
        return database_trips.reset()

    with row_locked_elsewhere(Order, order.pk):
        with_the_hold, without = round_trips(Q(payments__state="pending")), round_trips(None)

    assert with_the_hold == without


def test_the_hold_condition_may_be_the_dotted_path_of_a_callable(settings, make_order, consumer):
    settings.ORDER_TIMEOUT = {**settings.ORDER_TIMEOUT,
                              "HOLD_CONDITION": "testproject.shop.payments.in_flight"}
    order = make_order(in_seconds=-1)
    start_payment(order)

    assert consumer().run(once=True).held == 1


@pytest.mark.parametrize("value, message", [
    ("testproject.shop.payments.no_such_thing", "cannot be imported"),
    ("testproject.shop.payments.TIME_TO_PAY", "not callable"),
    (42, "a Q object"),
])
def test_a_bad_hold_condition_is_improperly_configured_naming_the_key(settings, value, message):
    settings.ORDER_TIMEOUT = {**settings.ORDER_TIMEOUT, "HOLD_CONDITION": value}

    with pytest.raises(ImproperlyConfigured, match=rf"ORDER_TIMEOUT\['HOLD_CONDITION'\].*{message}"):
        order_settings.load()


def test_a_hold_callable_that_returns_no_q_is_improperly_configured(settings):
    settings.ORDER_TIMEOUT = {**settings.ORDER_TIMEOUT,
                              "HOLD_CONDITION": "django.utils.timezone.now"}

    with pytest.raises(ImproperlyConfigured, match="HOLD_CONDITION"):
        order_settings.hold_condition()


@both_models
def test_the_scan_holds_an_order_redis_lost_and_puts_it_back_for_the_consumers(
        holds, make_order, order_model, queue):
    order = make_order(in_seconds=-600)
    start_payment(order)
    queue.unschedule([str(order.pk)])  # a failover lost its member

    result = compensate(now=timezone.now())

    assert (result.closed, result.held) == (0, 1)
    assert state(order) == "unpaid"
    assert score_of(queue, str(order.pk)) is not None  # the consumers look at it again


def test_a_paid_held_order_is_counted_nowhere(holds, make_order, consumer, queue, clock):
    order = make_order(in_seconds=-1)
    start_payment(order)
    consumer().run(once=True)
    Order.objects.get(pk=order.pk).mark_paid()

    health = measure(drift=False)

    assert (health.held, health.pending, health.overdue_unpaid_in_database) == (0, 0, 0)
    assert count_in(Order, "paid") == 1


@both_models
def test_a_batch_closed_as_keys_sets_its_held_orders_apart_and_closes_the_rest(
        holds, settings, order_model, consumer, queue, clock):
    """No receiver takes instances, so the batch is judged as a whole (keys, statuses and
    deadlines): the held orders are set apart, one held past MAX_HOLD is closed with its own
    reason, the others close as ever."""
    settings.ORDER_TIMEOUT = {**settings.ORDER_TIMEOUT, "MAX_HOLD": 3600}
    now = timezone.now()
    plain = [order_model.objects.create(expires_at=now - timedelta(seconds=5)) for _ in range(6)]
    recent = order_model.objects.create(expires_at=now - timedelta(minutes=30))
    late = order_model.objects.create(expires_at=now - timedelta(hours=2))
    for order in (recent, late):
        start_payment(order)

    with no_receivers(order_expired, orders_expired):
        stats = consumer().run(once=True)

    assert (stats.closed, stats.held) == (7, 1)
    assert state(recent) == "unpaid" and score_of(queue, str(recent.pk)) == now_score(clock()) + RECHECK * 1000
    reasons = dict(order_model._base_manager.filter(pk__in=[o.pk for o in [*plain, late]])
                   .values_list("pk", "close_reason"))
    assert reasons == {**{order.pk: "timeout" for order in plain}, late.pk: "hold_expired"}
