"""Deadlines by policy: the shop's callable gives each new unpaid order its time to pay.

The test project's policy (``testproject.shop.payments.deadline_by_payment_method``):
a card 15 minutes, a bank transfer 3 days, an invoice never.
"""

from __future__ import annotations

import logging
from datetime import datetime, timedelta

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.utils import timezone

from order_timeout.conf import settings as order_settings
from order_timeout.models import Order
from order_timeout.reporting.health import measure
from order_timeout.scans.compensation import compensate
from order_timeout.timers.members import deadline_score
from testproject.shop.models import ShopOrder

from .helpers import score_of, state

pytestmark = pytest.mark.django_db(transaction=True)

POLICY = "testproject.shop.payments.deadline_by_payment_method"
use_shop = pytest.mark.parametrize("order_model", ["shop.ShopOrder"], indirect=True, ids=["ShopOrder"])


@pytest.fixture
def policy(settings):
    settings.ORDER_TIMEOUT = {**settings.ORDER_TIMEOUT, "DEADLINE_POLICY": POLICY, "DEFAULT_TIMEOUT": 600}



@use_shop
@pytest.mark.parametrize("method, time_to_pay", [("card", timedelta(minutes=15)),
                                                 ("bank_transfer", timedelta(days=3))])
def test_each_payment_method_gets_its_own_deadline(policy, order_model, queue, method, time_to_pay):
    before = timezone.now()

    order = ShopOrder.objects.create(number="2001", payment_method=method)

    assert before + time_to_pay <= order.expires_at <= timezone.now() + time_to_pay
    assert score_of(queue, str(order.pk)) == deadline_score(order.expires_at)


@use_shop
def test_an_order_the_policy_gives_no_deadline_is_never_scheduled_scanned_or_closed(
        policy, order_model, queue, consumer):
    order = ShopOrder.objects.create(number="2002", payment_method="invoice")

    consumer().run(once=True)
    result = compensate(now=timezone.now() + timedelta(days=365))

    assert order.expires_at is None and score_of(queue, str(order.pk)) is None
    assert (result.examined, result.closed) == (0, 0)
    assert state(order) == "unpaid"
    assert measure(model=ShopOrder, drift=False).unpaid_without_deadline == 1


def test_a_deadline_given_at_creation_is_kept_whatever_the_policy(policy, queue):
    chosen = timezone.now() + timedelta(hours=5)

    order = Order.objects.create(expires_at=chosen)

    assert order.expires_at == chosen


def test_the_ready_made_order_follows_the_policy_too(policy, queue):
    order = Order.objects.create()  # no payment_method field: the policy's card default

    assert timezone.now() + timedelta(minutes=14) <= order.expires_at <= timezone.now() + timedelta(minutes=15)


@use_shop
def test_a_policy_that_raises_falls_back_to_the_default_timeout_and_says_why(
        policy, order_model, queue, caplog):
    """An unknown payment method: the policy raises KeyError. Checkout still succeeds."""
    before = timezone.now()
    with caplog.at_level(logging.ERROR, logger="order_timeout"):
        order = ShopOrder.objects.create(number="2003", payment_method="cash_on_the_moon")

    assert before + timedelta(seconds=600) <= order.expires_at <= timezone.now() + timedelta(seconds=600)
    assert score_of(queue, str(order.pk)) == deadline_score(order.expires_at)
    assert "DEADLINE_POLICY" in caplog.text and "KeyError" in caplog.text


def naive_policy(order):
    """A policy written in a hurry: a naive datetime (the app cannot tell its time zone)."""
    return datetime.now()


def test_a_policy_that_answers_a_naive_datetime_falls_back_and_says_why(settings, queue, caplog):
    settings.ORDER_TIMEOUT = {**settings.ORDER_TIMEOUT, "DEADLINE_POLICY": "tests.test_deadline_policy.naive_policy",
                              "DEFAULT_TIMEOUT": 600}
    with caplog.at_level(logging.ERROR, logger="order_timeout"):
        order = Order.objects.create()

    assert order.expires_at >= timezone.now() + timedelta(seconds=590)
    assert "not an aware datetime" in caplog.text


@pytest.mark.parametrize("value, message", [
    ("testproject.shop.payments.no_such_policy", "cannot be imported"),
    ("testproject.shop.payments.TIME_TO_PAY", "not callable"),
    ("deadline_by_payment_method", "dotted path"),
])
def test_a_bad_policy_path_is_improperly_configured_naming_the_key(settings, value, message):
    settings.ORDER_TIMEOUT = {**settings.ORDER_TIMEOUT, "DEADLINE_POLICY": value}

    with pytest.raises(ImproperlyConfigured, match=rf"ORDER_TIMEOUT\['DEADLINE_POLICY'\].*{message}"):
        order_settings.load()


@use_shop
def test_switching_to_a_faster_method_applies_the_policys_earlier_answer(policy, order_model, queue):
    """A bank transfer (3 days) becomes a card payment (15 minutes): the deadline comes forward."""
    order = ShopOrder.objects.create(number="2004", payment_method="bank_transfer")

    order.payment_method = "card"
    order.save(update_fields=["payment_method"])
    assert order.extend_deadline(order.policy_deadline()) is True

    row = ShopOrder.objects.get(pk=order.pk)
    assert row.expires_at <= timezone.now() + timedelta(minutes=15)
    assert score_of(queue, str(order.pk)) == deadline_score(row.expires_at)


@use_shop
def test_switching_to_invoice_takes_the_deadline_away(policy, order_model, queue, consumer):
    order = ShopOrder.objects.create(number="2005", payment_method="card")

    order.payment_method = "invoice"
    order.save(update_fields=["payment_method"])
    assert order.extend_deadline(order.policy_deadline()) is True

    assert ShopOrder.objects.get(pk=order.pk).expires_at is None
    assert score_of(queue, str(order.pk)) is None


@use_shop
def test_a_draft_placed_by_bank_transfer_gets_the_policys_deadline_when_it_enters_pending(
        policy, order_model, queue):
    order = ShopOrder.objects.create(number="2006", status="Draft", payment_method="bank_transfer")
    assert order.expires_at is None

    order.set_status("Pending")

    assert ShopOrder.objects.get(pk=order.pk).expires_at >= timezone.now() + timedelta(days=2, hours=23)
