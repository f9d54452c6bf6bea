"""order_timeout.testing, the kit a shop tests its timers with, in the test styles a shop already uses.

Each behaviour runs in a pytest-django default ``django_db`` test and in a Django ``TestCase``
(both inside a transaction rolled back at the end), with the suite's Redis and with
``TESTING_WITHOUT_REDIS`` and no Redis reachable at all. Seen before: a row reached Redis only
when its transaction committed, so neither style could test a timer, and a reminder's lead or a
hold's end could only be tested by rewriting the rows' deadlines.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
from django.conf import settings as django_settings
from django.core.management import call_command
from django.core.management.base import SystemCheckError
from django.db.models import Q
from django.test import TestCase, override_settings
from django.utils import timezone

from order_timeout.exceptions import OrderClosed
from order_timeout.models import Notice, Order, Reminder
from order_timeout.testing import capture_notices, queued_deadline, refused_writes, run_due, travel
from order_timeout.timers.members import datetime_of_score, deadline_score
from testproject.shop.models import (
    Checkout,
    Expiry,
    OrderPayment,
    PaymentState,
    ReminderEmail,
    StockRecord,
    StockReservation,
)

pytestmark = pytest.mark.django_db  # the default: a transaction rolled back after each test

# No Redis reachable at all: nothing listens on the discard port.
NOWHERE = "redis://127.0.0.1:9/0"


def without_redis(settings: Any) -> dict[str, Any]:
    """The settings of a test suite run where no Redis is."""
    caches = {**settings.CACHES, "order_timeout": {**settings.CACHES["order_timeout"], "LOCATION": NOWHERE}}
    return {"ORDER_TIMEOUT": {**settings.ORDER_TIMEOUT, "TESTING_WITHOUT_REDIS": True}, "CACHES": caches}


@pytest.fixture(params=["redis", "no redis"])
def redis(request: pytest.FixtureRequest, settings: Any) -> Iterator[str]:
    if request.param == "no redis":
        for name, value in without_redis(settings).items():
            setattr(settings, name, value)
    yield request.param


def set_order_timeout(settings: Any, **values: Any) -> None:
    settings.ORDER_TIMEOUT = {**settings.ORDER_TIMEOUT, **values}


def unpaid_order(minutes: float) -> Order:
    return Order.objects.create(expires_at=timezone.now() + timedelta(minutes=minutes))


# -- each behaviour, written once, run in both styles ---------------------------------------------


def an_unpaid_order_past_its_deadline_is_closed_with_its_receivers() -> None:
    order = unpaid_order(15)
    assert run_due().acted == 0  # not due yet

    with travel(minutes=20):
        ran = run_due()

    order.refresh_from_db()
    assert (order.status, ran.of("close").acted) == ("closed", 1)
    assert Expiry.objects.filter(order_id=str(order.pk)).count() == 1  # the shop's receiver, in the close's commit


def a_paid_order_is_left_alone() -> None:
    order = unpaid_order(15)
    order.mark_paid()

    with travel(minutes=20):
        ran = run_due()

    order.refresh_from_db()
    assert (order.status, ran.acted) == ("paid", 0)


def a_payment_in_flight_holds_its_order_until_max_hold() -> None:
    order = unpaid_order(1)
    OrderPayment.objects.create(order=order, state=PaymentState.PENDING)

    with travel(minutes=2):
        assert run_due().held == 1
    with travel(minutes=1 + 10 + 1):  # past its deadline plus MAX_HOLD (10 minutes)
        ran = run_due()

    order.refresh_from_db()
    assert (order.status, order.close_reason, ran.of("close").acted) == ("closed", "hold_expired", 1)


def a_reminder_goes_out_at_its_lead() -> None:
    order = unpaid_order(30)  # reminded 15 minutes before

    with travel(minutes=14):
        assert run_due("reminders").acted == 0
    with travel(minutes=16):
        ran = run_due("reminders")

    assert ran.of("reminders").acted == 1
    assert ReminderEmail.objects.filter(order_id=str(order.pk)).count() == 1
    assert Reminder.objects.filter(order_id=str(order.pk)).count() == 1


def a_declared_timer_acts_on_its_rows() -> None:
    stock = StockRecord.objects.create(num_in_stock=5, num_allocated=2)
    reservation = StockReservation.objects.create(stockrecord=stock, checkout=Checkout.objects.create(),
                                                  quantity=2, expires_at=timezone.now() + timedelta(minutes=10))

    with travel(minutes=11):
        ran = run_due("reservation-lapses")

    reservation.refresh_from_db()
    stock.refresh_from_db()
    assert (reservation.state, stock.num_allocated, ran.acted) == ("released", 0, 1)


def a_notice_is_written_by_the_close_and_delivered_to_the_outbox() -> None:
    order = unpaid_order(15)
    with capture_notices() as outbox, travel(minutes=20):
        run_due("close")
        written = outbox.pending("order-expired-email")
        assert [notice.key for notice in written] == [f"order-expired-email:order_timeout.order:{order.pk}"]
        assert outbox.delivered == []

        assert outbox.deliver() == 1

    assert outbox.keys() == [f"order-expired-email:order_timeout.order:{order.pk}"]
    assert outbox.delivered[0].object == order
    assert Notice.objects.get(pk=written[0].pk).state == Notice.State.DELIVERED


def a_payment_after_the_close_is_refused_and_recorded() -> None:
    order = unpaid_order(15)
    late = Order.objects.get(pk=order.pk)  # the payment callback's copy, read before the close
    with travel(minutes=20):
        run_due()

    with pytest.raises(OrderClosed):
        late.mark_paid()

    assert [write.refusal for write in refused_writes(order)] == ["paid_after_close"]


BEHAVIOURS = [an_unpaid_order_past_its_deadline_is_closed_with_its_receivers, a_paid_order_is_left_alone,
              a_payment_in_flight_holds_its_order_until_max_hold, a_reminder_goes_out_at_its_lead,
              a_declared_timer_acts_on_its_rows, a_notice_is_written_by_the_close_and_delivered_to_the_outbox,
              a_payment_after_the_close_is_refused_and_recorded]

# What a behaviour needs besides the defaults.
NEEDS: dict[Any, dict[str, Any]] = {
    a_payment_in_flight_holds_its_order_until_max_hold: {"HOLD_CONDITION": Q(payments__state="pending"),
                                                         "MAX_HOLD": 600},
    a_reminder_goes_out_at_its_lead: {"REMINDERS": [900]},
}


# -- pytest-django's default django_db: a transaction per test, rolled back -------------------------


@pytest.mark.parametrize("behaviour", BEHAVIOURS, ids=lambda behaviour: behaviour.__name__)
def test_in_a_default_django_db_test(behaviour: Any, redis: str, settings: Any) -> None:
    set_order_timeout(settings, **NEEDS.get(behaviour, {}))
    behaviour()


# -- Django's TestCase: the same, as a shop's unittest-style suite runs them --------------------------


class _InATestCase(TestCase):
    """Each behaviour as a TestCase method (subclassed with Redis, and without)."""

    __test__ = False  # only its subclasses run

    # With TESTING_WITHOUT_REDIS and no Redis reachable (set inside each test: the suite's own
    # fixtures empty the suite's Redis around it).
    without_redis = False

    def run_behaviour(self, behaviour: Any) -> None:
        overrides = without_redis(django_settings) if self.without_redis else {}
        with override_settings(**overrides), \
                override_settings(ORDER_TIMEOUT={**django_settings.ORDER_TIMEOUT, **overrides.get("ORDER_TIMEOUT", {}),
                                                 **NEEDS.get(behaviour, {})}):
            behaviour()


for _behaviour in BEHAVIOURS:
    setattr(_InATestCase, f"test_{_behaviour.__name__}",
            lambda self, behaviour=_behaviour: self.run_behaviour(behaviour))


class TestInATestCaseWithRedis(_InATestCase):
    __test__ = True


class TestInATestCaseWithoutRedis(_InATestCase):
    __test__ = True
    without_redis = True


# -- seeing, moving time, and the setting's guard -----------------------------------------------------


def test_the_queue_holds_the_deadline_a_save_gave_the_row(redis: str) -> None:
    order = unpaid_order(15)

    assert queued_deadline(order) == datetime_of_score(deadline_score(order.expires_at))
    order.mark_paid()
    assert queued_deadline(order) is None


def test_moving_time_leaves_the_rows_and_the_database_clock_as_they_are(redis: str) -> None:
    order = unpaid_order(15)
    with travel(minutes=20) as clock:
        assert abs(clock.now() - timezone.now() - timedelta(minutes=20)) < timedelta(seconds=5)
    assert abs(clock.now() - timezone.now()) < timedelta(seconds=5)
    assert Order.objects.get(pk=order.pk).expires_at == order.expires_at


def test_a_named_timer_that_does_not_exist_is_a_lookup_error() -> None:
    with pytest.raises(LookupError, match="no timer named nope"):
        run_due("nope")


def test_check_deploy_fails_while_testing_without_redis(settings: Any) -> None:
    set_order_timeout(settings, TESTING_WITHOUT_REDIS=True)

    with pytest.raises(SystemCheckError, match="order_timeout.E020"):
        call_command("check", "--deploy", "--tag", "order_timeout", "--fail-level", "ERROR")
