"""Adopting it on a framework's order the shop does not edit: a model shaped like Saleor's.

Tried on Saleor: adoption meant forking its Order (the mixin, the declarations, a migration of
its ``order`` app), and then 10 of its 17 expiry tests failed, their fixtures creating an order
in the default status and saving it ``unconfirmed``. Here the shop's own small app declares the
expiry from outside (``testproject/saleorlike/expiry.py``, as docs/saleor.md has it for Saleor):
no field, migration or method of the order model is the app's.
"""

from __future__ import annotations

import json
from datetime import timedelta
from decimal import Decimal
from io import StringIO

import pytest
from django.core.management import call_command
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from order_timeout.exceptions import OrderClosed
from order_timeout.models import Deadline
from order_timeout.scans.compensation import compensate
from order_timeout.timers.members import now_score
from order_timeout.timers.registry import registry
from testproject.saleorlike.expiry import UnconfirmedOrderExpires
from testproject.saleorlike.models import (
    Allocation,
    Channel,
    Order,
    OrderEvent,
    OrderStatus,
    Payment,
    Stock,
    TransactionItem,
    VoucherCode,
)

from .helpers import score_of

pytestmark = pytest.mark.django_db(transaction=True)

WINDOW = 30  # minutes: the channel's expire_orders_after


@pytest.fixture
def expiry(redis_client):
    """The shop's timer, registered as its app's timers.py would at start-up."""
    registry.register(Order, UnconfirmedOrderExpires)
    try:
        yield registry.get(UnconfirmedOrderExpires.name)
    finally:
        registry.unregister(UnconfirmedOrderExpires.name)


@pytest.fixture
def channel(db):
    return Channel.objects.create(slug="default-channel", expire_orders_after=WINDOW)


@pytest.fixture
def expiring(expiry, consumer):
    """A consumer of the expiry alone (on the database's clock: these deadlines are real times)."""
    return lambda: consumer(kinds=[expiry], follow_database_clock=True, now=None).run(once=True)


def placed(channel, minutes_ago: float = 0, status=OrderStatus.UNCONFIRMED, **fields):
    """An order as Saleor's fixtures make one: created in the default status, then saved in another."""
    order = Order.objects.create(channel=channel, created_at=timezone.now() - timedelta(minutes=minutes_ago),
                                 **fields)
    order.status = status
    order.save()
    return order


def refreshed(order):
    return Order.objects.get(pk=order.pk)


def deadline_of(order):
    return Deadline.objects.filter(timer=UnconfirmedOrderExpires.name, object_id=str(order.pk)).values_list(
        "expires_at", flat=True).first()


@pytest.fixture
def queue_of(expiry, queue):
    return queue.of_kind(expiry.key_space)


def test_a_fixture_that_rewrites_the_default_status_gets_its_deadline_and_no_error(expiry, channel, queue_of):
    order = placed(channel)

    assert deadline_of(order) == order.created_at + timedelta(minutes=WINDOW)
    assert score_of(queue_of, str(order.pk)) is not None


def test_an_unconfirmed_order_expires_with_saleors_own_close(expiry, channel, expiring):
    stock = Stock.objects.create(quantity=10, quantity_allocated=3)
    VoucherCode.objects.create(code="SPRING", used=1)
    order = placed(channel, minutes_ago=WINDOW + 1, voucher_code="SPRING")
    Allocation.objects.create(order=order, stock=stock, quantity_allocated=3)

    stats = expiring()

    row = refreshed(order)
    assert (row.status, stats.of(expiry.name).acted) == (OrderStatus.EXPIRED, 1)
    assert row.expired_at is not None and row.expired_at >= row.created_at + timedelta(minutes=WINDOW)
    assert OrderEvent.objects.filter(order=order, type="expired").count() == 1
    assert Stock.objects.get().quantity_allocated == 0 and VoucherCode.objects.get().used == 0
    assert deadline_of(order) is None


def test_an_order_not_due_yet_is_left_alone(expiry, channel, expiring):
    order = placed(channel, minutes_ago=WINDOW - 5)

    expiring()

    assert refreshed(order).status == OrderStatus.UNCONFIRMED


@pytest.mark.parametrize("in_flight", ["transaction-charge", "transaction-authorization", "payment"])
def test_money_on_its_way_holds_the_order(expiry, channel, expiring, in_flight):
    order = placed(channel, minutes_ago=WINDOW + 1)
    if in_flight == "payment":
        Payment.objects.create(order=order, charge_status="pending")
    else:
        field = "charge_pending_value" if in_flight == "transaction-charge" else "authorize_pending_value"
        TransactionItem.objects.create(order=order, **{field: Decimal("10")})

    stats = expiring()

    assert refreshed(order).status == OrderStatus.UNCONFIRMED and stats.of(expiry.name).held == 1


def test_a_fully_charged_order_waiting_for_staff_is_never_expired(expiry, channel, expiring):
    """Saleor keeps a paid order unconfirmed when the channel does not confirm automatically."""
    order = placed(channel, minutes_ago=3 * 24 * 60, charge_status="full")
    TransactionItem.objects.create(order=order, charged_value=Decimal("10"))

    expiring()
    compensate(now=timezone.now())

    assert refreshed(order).status == OrderStatus.UNCONFIRMED
    out = StringIO()
    call_command("order_timeout_status", "--json", stdout=out)
    assert json.loads(out.getvalue())["timers"][expiry.name]["settled"] == 1


def test_a_confirmed_order_loses_its_deadline_and_is_never_expired(expiry, channel, expiring, queue_of):
    order = placed(channel, minutes_ago=WINDOW - 1)
    order.status = OrderStatus.UNFULFILLED  # staff confirmed it, before its deadline
    order.save(update_fields=["status", "updated_at"])

    assert deadline_of(order) is None and score_of(queue_of, str(order.pk)) is None
    expiring()
    assert refreshed(order).status == OrderStatus.UNFULFILLED


def test_a_draft_completed_gets_its_deadline_then(expiry, channel):
    order = Order.objects.create(channel=channel, status=OrderStatus.DRAFT)
    assert deadline_of(order) is None

    order.status = OrderStatus.UNCONFIRMED  # draftOrderComplete, in a channel that does not confirm
    order.save(update_fields=["status"])

    assert deadline_of(order) == order.created_at + timedelta(minutes=WINDOW)


def test_a_channel_without_a_window_never_expires_its_orders(expiry, expiring):
    channel = Channel.objects.create(slug="b2b", expire_orders_after=None)
    order = placed(channel, minutes_ago=10_000)

    expiring()

    assert deadline_of(order) is None and refreshed(order).status == OrderStatus.UNCONFIRMED


def test_an_expired_order_is_never_confirmed_afterwards(expiry, channel, expiring):
    order = placed(channel, minutes_ago=WINDOW + 1)
    expiring()
    stale = Order.objects.get(pk=order.pk)
    Order.objects.filter(pk=order.pk).update(status=OrderStatus.EXPIRED)  # as the close wrote it
    stale.status = OrderStatus.UNFULFILLED

    with pytest.raises(OrderClosed):
        stale.save()


def test_the_scan_expires_what_redis_lost(expiry, channel, queue_of, settings):
    settings.ORDER_TIMEOUT = {**settings.ORDER_TIMEOUT, "COMPENSATION_GRACE": 0}
    order = placed(channel, minutes_ago=WINDOW + 10)
    queue_of.unschedule([str(order.pk)])

    result = compensate(now=timezone.now())

    assert refreshed(order).status == OrderStatus.EXPIRED and result.timers[expiry.name].closed == 1


def test_an_ordinary_save_of_a_waiting_order_costs_no_query_of_the_app(expiry, channel):
    order = refreshed(placed(channel))
    order.voucher_code = "LATER"

    with CaptureQueriesContext(connection) as queries:
        order.save(update_fields=["voucher_code", "updated_at"])

    assert len(queries) == 1, [query["sql"] for query in queries]


def test_a_row_loaded_with_deferred_fields_is_looked_up_not_guessed(expiry, channel):
    order = placed(channel)
    partial = Order.objects.only("id", "status").get(pk=order.pk)

    partial.save(update_fields=["status"])  # still unconfirmed: keeps its deadline

    assert deadline_of(order) == order.created_at + timedelta(minutes=WINDOW)


def test_a_longer_window_redates_the_open_orders_of_that_channel(expiry, channel):
    other = Channel.objects.create(slug="other", expire_orders_after=WINDOW)
    mine, theirs = placed(channel), placed(other)
    Channel.objects.filter(pk__in=[channel.pk, other.pk]).update(expire_orders_after=2 * WINDOW)
    out = StringIO()

    call_command("order_timeout_redate", "--timer", expiry.name, "--where", "channel__slug=default-channel",
                 "--json", stdout=out)

    assert json.loads(out.getvalue())["later"] == 1
    assert deadline_of(mine) == mine.created_at + timedelta(minutes=2 * WINDOW)
    assert deadline_of(theirs) == theirs.created_at + timedelta(minutes=WINDOW)


def test_a_deleted_order_takes_its_deadline_and_member_with_it(expiry, channel, queue_of):
    order = placed(channel)
    pk = order.pk

    order.delete()

    assert not Deadline.objects.filter(timer=UnconfirmedOrderExpires.name, object_id=str(pk)).exists()
    assert score_of(queue_of, str(pk)) is None


# -- settled is not final: a refund after the charge ------------------------------------------------

def test_a_charged_order_keeps_its_deadline_and_expires_once_refunded(expiry, channel, queue_of, consumer, clock,
                                                                      settings):
    """Tried on Saleor: fully charged, then refunded (charge status back to none), the order stayed
    unconfirmed past its deadline with no deadline and nothing in Redis, for good."""
    order = placed(channel, minutes_ago=WINDOW + 1, charge_status="full")
    expiring = consumer(kinds=[expiry])

    assert expiring.run(once=True).of(expiry.name).settled == 1
    assert deadline_of(order) is not None  # settled, not done: its deadline stays
    assert score_of(queue_of, str(order.pk)) == now_score(clock()) + 1000 * settings.ORDER_TIMEOUT.get(
        "HOLD_RECHECK", 30)

    Order.objects.filter(pk=order.pk).update(charge_status="none")  # refunded
    clock.advance(settings.ORDER_TIMEOUT.get("HOLD_RECHECK", 30))
    stats = expiring.run(once=True)

    assert (refreshed(order).status, stats.of(expiry.name).acted) == (OrderStatus.EXPIRED, 1)
    assert deadline_of(order) is None


def test_a_charged_order_meanwhile_counts_as_settled_for_the_scan_and_status(expiry, channel, queue_of, settings):
    settings.ORDER_TIMEOUT = {**settings.ORDER_TIMEOUT, "COMPENSATION_GRACE": 0}
    order = placed(channel, minutes_ago=WINDOW + 10, charge_status="full")
    queue_of.unschedule([str(order.pk)])

    result = compensate(now=timezone.now())
    figures = json.loads(command_output("order_timeout_status", "--json"))["timers"][expiry.name]

    assert result.timers[expiry.name].examined == 0 and refreshed(order).status == OrderStatus.UNCONFIRMED
    assert (figures["settled"], figures["overdue_in_database"], figures["held_in_database"]) == (1, 0, 0)
    assert deadline_of(order) is not None


def test_a_charged_order_refunded_while_redis_lost_it_is_expired_by_the_scan(expiry, channel, queue_of, settings):
    settings.ORDER_TIMEOUT = {**settings.ORDER_TIMEOUT, "COMPENSATION_GRACE": 0}
    order = placed(channel, minutes_ago=WINDOW + 10, charge_status="full")
    queue_of.unschedule([str(order.pk)])
    Order.objects.filter(pk=order.pk).update(charge_status="none")

    result = compensate(now=timezone.now())

    assert refreshed(order).status == OrderStatus.EXPIRED and result.timers[expiry.name].closed == 1


def command_output(command, *args):
    out = StringIO()
    call_command(command, *args, stdout=out)
    return out.getvalue()


# -- a charge after the expiry --------------------------------------------------------------------

@pytest.fixture
def refunds():
    """The shop's own refund of a charge reported after the expiry (testproject/saleorlike/refunds.py)."""
    from django.db.models.signals import post_save

    from testproject.saleorlike.models import TransactionItem
    from testproject.saleorlike.refunds import refund_a_charge_after_the_expiry

    post_save.connect(refund_a_charge_after_the_expiry, sender=TransactionItem, dispatch_uid="test.refunds")
    yield
    post_save.disconnect(sender=TransactionItem, dispatch_uid="test.refunds")


def test_a_charge_reported_after_the_expiry_is_asked_back_once(expiry, channel, expiring, refunds):
    from testproject.saleorlike.models import TransactionEvent

    order = placed(channel, minutes_ago=WINDOW + 1)
    expiring()
    charge = TransactionItem.objects.create(order=order, charged_value=Decimal("10"))  # the late webhook
    charge.save()  # Saleor saves the transaction again as it recomputes its amounts

    assert refreshed(order).status == OrderStatus.EXPIRED
    assert list(TransactionEvent.objects.values_list("type", "amount_value")) == [("refund_request", Decimal("10"))]

