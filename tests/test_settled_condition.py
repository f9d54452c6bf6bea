"""Paid by another column: SETTLED_CONDITION settles an order whatever its status says.

Tried on Saleor: a channel that does not confirm orders automatically keeps a fully charged order
"unconfirmed" (Saleor's unpaid value) until staff confirm it. With only a hold condition such an
order was held, then closed ``hold_expired`` after MAX_HOLD with its charge taken and its stock
released. A settled condition (here: a succeeded payment) says it is paid: never closed, never
held toward MAX_HOLD, no reminder, never walked by the scan, and a figure of its own.
"""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.core import checks
from django.core.management import call_command
from django.db.models import Q
from django.utils import timezone

from order_timeout.reporting.health import measure
from order_timeout.scans.compensation import compensate
from testproject.shop.models import OrderPayment, Payment, PaymentState, ReminderEmail, ShopOrder

from .conftest import both_models
from .helpers import expiries, leased_members, pending_count, state

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def settled_by_payment(settings):
    settings.ORDER_TIMEOUT = {**settings.ORDER_TIMEOUT, "HOLD_CONDITION": Q(payments__state="pending"),
                              "SETTLED_CONDITION": Q(payments__state="succeeded"), "MAX_HOLD": 60}


def pay_elsewhere(order, state=PaymentState.SUCCEEDED):
    """Money received by the shop's payment rows; the order's status still says unpaid (Saleor's
    "unconfirmed" waiting for staff)."""
    kind = Payment if isinstance(order, ShopOrder) else OrderPayment
    return kind.objects.create(order=order, state=state)


@both_models
def test_an_unpaid_order_the_settled_condition_settles_is_never_closed(settled_by_payment, make_order, consumer,
                                                                     queue):
    order = make_order(in_seconds=-1)
    pay_elsewhere(order)

    stats = consumer().run(once=True)

    assert state(order) == "unpaid" and expiries(order) == 0
    assert (stats.closed, stats.skipped_paid, stats.held) == (0, 1, 0)
    # Its deadline stays: looked at again every HOLD_RECHECK, should it stop being settled.
    assert pending_count(queue) == 1 and leased_members(queue) == []


@both_models
def test_a_settled_order_is_not_held_toward_max_hold_and_never_closed_hold_expired(settled_by_payment, order_model,
                                                                                  consumer):
    """A pending payment and a succeeded one: settled wins; two hours past a one-minute MAX_HOLD."""
    order = order_model.objects.create(expires_at=timezone.now() - timedelta(hours=2))
    pay_elsewhere(order, PaymentState.PENDING)
    pay_elsewhere(order)

    stats = consumer().run(once=True)

    assert state(order) == "unpaid" and (stats.closed, stats.held, stats.skipped_paid) == (0, 0, 1)


@both_models
def test_the_scan_never_closes_a_settled_order_and_the_status_command_counts_it_apart(
        settled_by_payment, make_order, order_model, queue, capsys):
    order = make_order(in_seconds=-600)
    pay_elsewhere(order)
    queue.unschedule([str(order.pk)])  # Redis lost it: only the scan would find it

    result = compensate(now=timezone.now())
    health = measure(model=order_model, drift=True)

    assert result.closed == 0 and state(order) == "unpaid"
    assert (health.settled_unpaid, health.overdue_unpaid_in_database, health.drift) == (1, 0, 0)
    call_command("order_timeout_status", "--max-overdue", "0", "--max-drift", "0")
    assert "settled unpaid" in capsys.readouterr().out


@both_models
def test_no_reminder_goes_to_a_settled_order(settled_by_payment, settings, order_model):
    from order_timeout.consumer import Consumer

    settings.ORDER_TIMEOUT = {**settings.ORDER_TIMEOUT, "REMINDERS": [60]}
    order = order_model.objects.create(expires_at=timezone.now() + timedelta(seconds=30))
    pay_elsewhere(order)

    stats = Consumer().run(once=True)

    assert stats.reminders.sent == 0 and not ReminderEmail.objects.exists()


@pytest.mark.parametrize("condition", [Q(no_such_field=1), "tests.test_settings.not_a_q"],
                         ids=["unknown-field", "returns-a-str"])
def test_a_settled_condition_that_does_not_fit_the_order_model_is_a_check_error(settings, condition):
    settings.ORDER_TIMEOUT = {**settings.ORDER_TIMEOUT, "SETTLED_CONDITION": condition}

    assert "order_timeout.E013" in [message.id for message in checks.run_checks(tags=["order_timeout"])]


# -- what a close writes, declared: CLOSE_FIELDS ---------------------------------------------


@pytest.fixture
def closes_into_the_shops_own_columns(settings):
    """The shop's model keeps its own expiry columns (Saleor's expired_at): the close writes them."""
    settings.ORDER_TIMEOUT = {**settings.ORDER_TIMEOUT, "ORDER_MODEL": "shop.ShopOrder",
                              "CLOSE_FIELDS": {"date_placed": "time", "number": "reason"}}


def test_the_close_writes_the_fields_close_fields_names(closes_into_the_shops_own_columns, consumer):
    from order_timeout.scheduling import connect_receivers, disconnect_receivers

    connect_receivers(ShopOrder)
    try:
        order = ShopOrder.objects.create(expires_at=timezone.now() - timedelta(seconds=1))
        consumer().run(once=True)
    finally:
        disconnect_receivers(ShopOrder)

    row = ShopOrder.objects.get(pk=order.pk)
    assert row.status == "Cancelled" and row.number == "timeout"
    assert row.date_placed == row.closed_at


@pytest.mark.parametrize("fields, problem", [
    ({"no_such_field": "time"}, "not a field"),
    ({"number": "time"}, "not a DateTimeField"),
    ({"date_placed": "reason"}, "not a text field"),
], ids=["unknown-field", "time-into-text", "reason-into-a-date"])
def test_close_fields_that_do_not_fit_the_order_model_are_a_check_error(settings, fields, problem):
    settings.ORDER_TIMEOUT = {**settings.ORDER_TIMEOUT, "ORDER_MODEL": "shop.ShopOrder", "CLOSE_FIELDS": fields}

    errors = [message for message in checks.run_checks(tags=["order_timeout"]) if message.id == "order_timeout.E018"]
    assert errors and problem in errors[0].msg


@pytest.mark.parametrize("extra, key", [
    ({"SETTLED_CONDITION": Q(no_such_field=1)}, "SETTLED_CONDITION"),
    ({"ORDER_MODEL": "shop.ShopOrder", "CLOSE_FIELDS": {"number": "time"}}, "CLOSE_FIELDS"),
], ids=["settled-condition", "close-fields"])
def test_a_consumer_refuses_to_start_on_a_setting_that_would_fail_every_close(settings, extra, key):
    from django.core.exceptions import ImproperlyConfigured

    from order_timeout.consumer import Consumer

    settings.ORDER_TIMEOUT = {**settings.ORDER_TIMEOUT, **extra}

    with pytest.raises(ImproperlyConfigured, match=rf"ORDER_TIMEOUT\['{key}'\]"):
        Consumer()


def test_close_fields_that_are_not_a_dict_of_time_or_reason_name_the_key(settings):
    from django.core.exceptions import ImproperlyConfigured

    from order_timeout.conf import settings as order_settings

    settings.ORDER_TIMEOUT = {**settings.ORDER_TIMEOUT, "CLOSE_FIELDS": {"expired_at": "now"}}

    with pytest.raises(ImproperlyConfigured, match=r"ORDER_TIMEOUT\['CLOSE_FIELDS'\]"):
        order_settings.load()


@both_models
def test_an_order_that_stops_being_settled_is_closed_at_the_next_look(settled_by_payment, make_order, consumer,
                                                                     clock, queue):
    """Settled is not final: the payment refunded, the order closes HOLD_RECHECK later at most."""
    order = make_order(in_seconds=-1)
    payment = pay_elsewhere(order)
    worker = consumer()
    assert worker.run(once=True).skipped_paid == 1 and state(order) == "unpaid"

    payment.state = PaymentState.FAILED  # refunded: no payment of the order has succeeded now
    payment.save()
    clock.advance(30)
    stats = worker.run(once=True)

    assert (state(order), stats.closed, expiries(order)) == ("closed", 1, 1)
    assert pending_count(queue) == 0
