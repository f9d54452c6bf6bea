"""The Saleor-shaped shop's expiry of unconfirmed orders, tested in its own style: plain ``django_db``
tests with the kit's fixtures, the time moved rather than the rows rewritten."""


import pytest

from order_timeout.testing import refused_writes
from testproject.saleorlike.models import Allocation, Channel, Order, OrderEvent, OrderStatus, Payment, Stock
from testproject.saleorlike.mutations import order_confirm

pytestmark = pytest.mark.django_db

WINDOW = 30  # minutes an unconfirmed order waits for its payment (the channel's setting)


@pytest.fixture
def channel():
    return Channel.objects.create(slug="default-channel", expire_orders_after=WINDOW)


def unconfirmed(channel):
    """An order as Saleor's checkout leaves one: created, then saved unconfirmed."""
    order = Order.objects.create(channel=channel)
    order.status = OrderStatus.UNCONFIRMED
    order.save()
    return order


def test_an_unconfirmed_order_expires_after_its_channels_window_and_gives_its_stock_back(
        channel, timeout_runner, timeout_clock):
    stock = Stock.objects.create(quantity=10, quantity_allocated=3)
    order = unconfirmed(channel)
    Allocation.objects.create(order=order, stock=stock, quantity_allocated=3)

    timeout_clock.advance(minutes=WINDOW - 1)
    assert timeout_runner("saleor-order-expiry").acted == 0
    timeout_clock.advance(minutes=2)
    assert timeout_runner("saleor-order-expiry").acted == 1

    order.refresh_from_db()
    stock.refresh_from_db()
    assert (order.status, stock.quantity_allocated) == (OrderStatus.EXPIRED, 0)
    assert OrderEvent.objects.filter(order=order, type="expired").count() == 1


def test_a_payment_in_flight_holds_the_order_until_max_hold(channel, timeout_runner, timeout_clock, settings):
    settings.ORDER_TIMEOUT = {**settings.ORDER_TIMEOUT, "MAX_HOLD": 3600}
    order = unconfirmed(channel)
    Payment.objects.create(order=order, charge_status="pending")

    timeout_clock.advance(minutes=WINDOW + 1)
    assert timeout_runner("saleor-order-expiry").held == 1
    timeout_clock.advance(hours=1)  # the payment never settled: MAX_HOLD ends the hold
    timeout_runner("saleor-order-expiry")

    order.refresh_from_db()
    assert order.status == OrderStatus.EXPIRED


def test_staff_confirming_an_expired_order_get_an_error_and_the_write_is_recorded(
        channel, timeout_runner, timeout_clock):
    order = unconfirmed(channel)
    opened = Order.objects.get(pk=order.pk)  # staff opened it before the expiry

    timeout_clock.advance(minutes=WINDOW + 1)
    timeout_runner("saleor-order-expiry")
    answer = order_confirm(opened)

    assert answer["order"] is None and answer["errors"][0]["code"] == "INVALID"
    assert [write.refusal for write in refused_writes(order)] == ["paid_after_close"]
