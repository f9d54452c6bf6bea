"""The shop's timers, tested as the rest of its code is: ordinary ``django_db`` tests (a transaction
rolled back after each), with the fixtures installing django-order-timeout brings. Run with the
project's Redis, and with ``TESTING_WITHOUT_REDIS`` where none is (docs/testing.md)."""

from datetime import timedelta

import pytest
from django.core import mail
from django.utils import timezone

from order_timeout.models import Order
from order_timeout.testing import queued_deadline
from testproject.shop.models import Checkout, ReminderEmail, StockRecord, StockReservation

pytestmark = pytest.mark.django_db


def checkout(minutes_to_pay=30):
    """An order placed now, unpaid, with its payment deadline ``minutes_to_pay`` away."""
    return Order.objects.create(expires_at=timezone.now() + timedelta(minutes=minutes_to_pay))


def test_an_unpaid_order_past_its_deadline_is_closed_and_its_customer_told(
        timeout_runner, timeout_clock, timeout_outbox):
    order = checkout(minutes_to_pay=30)
    assert queued_deadline(order) is not None  # the save queued it

    timeout_clock.advance(minutes=31)
    ran = timeout_runner()

    order.refresh_from_db()
    assert order.status == "closed" and ran.of("close").acted == 1
    assert timeout_outbox.keys() == [f"order-expired-email:order_timeout.order:{order.pk}"]


def test_a_paid_order_is_never_closed(timeout_runner, timeout_clock):
    order = checkout(minutes_to_pay=30)
    order.mark_paid()

    timeout_clock.advance(hours=2)
    timeout_runner()

    order.refresh_from_db()
    assert order.status == "paid"


def test_a_reminder_goes_out_15_minutes_before_the_deadline(timeout_runner, timeout_clock, settings):
    settings.ORDER_TIMEOUT = {**settings.ORDER_TIMEOUT, "REMINDERS": [15 * 60]}
    order = checkout(minutes_to_pay=30)

    timeout_clock.advance(minutes=14)
    timeout_runner()
    assert not ReminderEmail.objects.filter(order_id=str(order.pk)).exists()

    timeout_clock.advance(minutes=2)
    timeout_runner()
    assert ReminderEmail.objects.filter(order_id=str(order.pk)).count() == 1


def test_the_customers_email_is_sent_when_the_notice_is_delivered(timeout_runner, timeout_clock):
    order = checkout(minutes_to_pay=30)
    timeout_clock.advance(minutes=31)

    timeout_runner()  # the close, then its notices: through the shop's own e-mail handler

    assert [message.to for message in mail.outbox] == [[f"customer-{order.pk}@example.com"]]


def test_a_lapsed_reservation_gives_its_stock_back(timeout_runner, timeout_clock):
    stock = StockRecord.objects.create(num_in_stock=5, num_allocated=2)
    reservation = StockReservation.objects.create(
        stockrecord=stock, checkout=Checkout.objects.create(), quantity=2,
        expires_at=timezone.now() + timedelta(minutes=10))

    timeout_clock.advance(minutes=11)
    timeout_runner("reservation-lapses")

    reservation.refresh_from_db()
    stock.refresh_from_db()
    assert (reservation.state, stock.num_allocated) == ("released", 0)


def test_a_reservation_whose_checkout_is_completing_waits_for_it(timeout_runner, timeout_clock):
    stock = StockRecord.objects.create(num_in_stock=5, num_allocated=2)
    completing = Checkout.objects.create(state="completing")
    reservation = StockReservation.objects.create(
        stockrecord=stock, checkout=completing, quantity=2, expires_at=timezone.now() + timedelta(minutes=10))

    timeout_clock.advance(minutes=11)
    assert timeout_runner("reservation-lapses").held == 1

    reservation.refresh_from_db()
    assert reservation.state == "held"
