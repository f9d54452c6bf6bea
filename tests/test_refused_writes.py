"""A write the app refuses reaches a person: every refusal of a write that would undo a deadline's
act is kept as a ``RefusedWrite`` (which row, which timer, when, what it tried to write).

Tried on a ticket shop whose payment code commits the payment's own row before it saves the order:
the refused order save left a confirmed payment on an expired order, 10-17 of 40 in three runs,
and nobody was told. The refusal rolls back the transaction it is raised in (the shop's, or the
app's own around a save), so the record is written apart from it, on a connection of its own; a
record that cannot be written never changes what the caller gets.
"""

from __future__ import annotations

import logging
import pickle
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta
from decimal import Decimal
from typing import Any

import pytest
from asgiref.sync import async_to_sync
from django.core.serializers.json import DjangoJSONEncoder
from django.db import connections, router, transaction
from django.utils import timezone

from order_timeout.exceptions import OrderClosed, StaleOrderStatus
from order_timeout.models import CLOSE_TIMER, RefusedWrite
from order_timeout.timers.registry import registry
from testproject.saleorlike.expiry import UnconfirmedOrderExpires
from testproject.saleorlike.models import Channel, Order as SaleorOrder, OrderStatus
from testproject.shop.models import OrderStatusChange, Purchase

from .conftest import both_models, free_port

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def no_refused_writes_before() -> None:
    """Each test counts its own: a test outside a transaction of its own may have left one."""
    RefusedWrite.objects.all().delete()


@contextmanager
def recording_database_unreachable() -> Iterator[None]:
    """New connections to the database the records go to find nothing listening (a port no server
    has); connections open already, the caller's among them, go on as they were."""
    caller = connections[router.db_for_write(RefusedWrite)]
    caller.ensure_connection()  # the test's own, which the refused write runs on
    settings_dict = caller.settings_dict
    before = settings_dict["HOST"], settings_dict["PORT"]
    settings_dict["HOST"], settings_dict["PORT"] = "127.0.0.1", free_port()
    try:
        yield
    finally:
        settings_dict["HOST"], settings_dict["PORT"] = before


def refused_row(order: Any) -> tuple[str, str, str, str, dict[str, Any], bool]:
    (refused,) = RefusedWrite.objects.filter(object_id=str(order.pk))
    return refused.model, refused.object_id, refused.timer, refused.refusal, refused.values, refused.is_handled


def closed(make_order: Any, consumer: Any) -> Any:
    """An order its deadline closed (the consumer's close), as the payment's copy read it before."""
    order = make_order(in_seconds=-1)
    consumer().run(once=True)
    return order


# -- mark_paid() after the close -------------------------------------------------------------------


@both_models
def test_mark_paid_after_the_close_records_the_payment_for_staff(make_order, consumer, order_model):
    order = closed(make_order, consumer)

    with pytest.raises(OrderClosed):
        order.mark_paid()

    assert refused_row(order) == (order_model._meta.label, str(order.pk), CLOSE_TIMER, "paid_after_close",
                                  {order_model.TIMEOUT_STATUS_FIELD: order_model.TIMEOUT_PAID_STATUS}, False)
    assert order_model.objects.get(pk=order.pk).timeout_status == order_model.TIMEOUT_CLOSED_STATUS


@both_models
def test_mark_paid_inside_a_transaction_that_rolls_back_still_leaves_its_record(make_order, consumer):
    order = closed(make_order, consumer)

    with pytest.raises(OrderClosed), transaction.atomic():
        order.mark_paid()

    assert refused_row(order)[3] == "paid_after_close"


@both_models
def test_amark_paid_after_the_close_records_the_payment_as_mark_paid_does(make_order, consumer, order_model):
    order = closed(make_order, consumer)

    with pytest.raises(OrderClosed):
        async_to_sync(order.amark_paid)()

    assert refused_row(order)[2:4] == (CLOSE_TIMER, "paid_after_close")


def test_the_extra_fields_mark_paid_tried_are_recorded_as_json(make_order, consumer):
    """``Order`` has no payment columns of its own: its deadline stands in for a field a payment writes."""
    order = closed(make_order, consumer)
    later = timezone.now() + timedelta(hours=1)

    with pytest.raises(OrderClosed):
        order.mark_paid(expires_at=later, close_reason="")

    assert refused_row(order)[4] == {"status": "paid", "expires_at": DjangoJSONEncoder().default(later),
                                     "close_reason": ""}


@both_models
def test_the_refusal_names_its_order_and_timer_for_whoever_catches_it(make_order, consumer, order_model):
    order = closed(make_order, consumer)

    with pytest.raises(OrderClosed) as refused:
        order.mark_paid()

    assert (refused.value.model_label, refused.value.pk, refused.value.timer) == (
        order_model._meta.label, order.pk, CLOSE_TIMER)


@pytest.mark.parametrize("refusal", [OrderClosed, StaleOrderStatus])
def test_a_refusal_keeps_its_order_and_timer_through_pickling_and_older_callers_get_none(refusal):
    named = refusal("Order A-7 was already closed.", model_label="order_timeout.Order", pk=7, timer="close",
                    public_name="A-7")
    named.refused_write_id = 12
    bare = refusal("Order 7 was already closed.")

    copy = pickle.loads(pickle.dumps(named))

    assert (type(copy), str(copy), copy.model_label, copy.pk, copy.timer, copy.public_name, copy.refused_write_id) == (
        refusal, str(named), "order_timeout.Order", 7, "close", "A-7", 12)
    assert str(copy).startswith("Order A-7 was already closed. This write was not made;")
    assert str(copy).endswith(" Refused write #12 records it for staff.")
    assert (bare.model_label, bare.pk, bare.timer, bare.public_name, bare.refused_write_id) == (None,) * 5


def test_an_order_model_names_its_rows_by_the_field_its_options_give(monkeypatch):
    """``TIMEOUT_PUBLIC_NAME``: the order model's option naming the field its clients know."""
    monkeypatch.setattr(Purchase, "TIMEOUT_PUBLIC_NAME", "customer")
    order = Purchase.objects.create(customer="ACME-7", expires_at=timezone.now() - timedelta(minutes=1))
    Purchase.objects.filter(pk=order.pk).update(status="closed", closed_at=timezone.now())

    with pytest.raises(OrderClosed) as refused:
        Purchase.objects.get(pk=order.pk).mark_paid()

    row = RefusedWrite.objects.get(object_id=str(order.pk))
    assert refused.value.message_alone == "Purchase ACME-7 was already closed."
    assert (refused.value.public_name, refused.value.pk, refused.value.refused_write_id) == ("ACME-7", order.pk, row.pk)
    assert row.public_name == "ACME-7"


def test_a_paid_order_answers_false_and_records_nothing(make_order):
    order = make_order(in_seconds=600)
    order.mark_paid()

    assert order.mark_paid() is False
    assert not RefusedWrite.objects.exists()


def test_a_deadline_extended_after_the_close_is_refused_without_a_record(make_order, consumer):
    """No payment was taken: the customer asked for more time and got an error."""
    order = closed(make_order, consumer)

    with pytest.raises(OrderClosed):
        order.extend_deadline(timezone.now() + timedelta(hours=1))

    assert not RefusedWrite.objects.exists()


# -- the order model's own save() --------------------------------------------------------------------


@pytest.mark.parametrize("order_model", ["shop.ShopOrder"], indirect=True)
def test_a_shop_state_machine_paying_a_closed_order_is_recorded_with_what_it_tried(make_order, consumer):
    checkout_copy = make_order(in_seconds=-1)  # read while it was pending
    consumer().run(once=True)

    with pytest.raises(OrderClosed):
        checkout_copy.set_status("Paid")

    assert refused_row(checkout_copy) == (
        "shop.ShopOrder", str(checkout_copy.pk), CLOSE_TIMER, "paid_after_close",
        {"status": "Paid", "closed_at": None, "close_reason": ""}, False)
    assert not OrderStatusChange.objects.filter(order_id=checkout_copy.pk, new_status="Paid").exists()


@pytest.mark.parametrize("order_model", ["shop.ShopOrder"], indirect=True)
def test_a_stale_copy_moving_a_closed_order_along_is_recorded_as_a_stale_save(make_order, consumer):
    stale = make_order(in_seconds=-1)  # read while it was pending
    consumer().run(once=True)
    stale.status = "Being processed"

    with pytest.raises(StaleOrderStatus):
        stale.save(update_fields=["status"])

    assert refused_row(stale)[2:5] == (CLOSE_TIMER, "stale_save", {"status": "Being processed"})


@pytest.mark.parametrize("order_model", ["shop.ShopOrder"], indirect=True)
def test_a_settled_order_moved_back_to_unpaid_is_refused_without_a_record(make_order):
    """Nothing a deadline did is undone: the order was paid, never closed."""
    order = make_order(in_seconds=600)
    order.mark_paid()
    order.status = "Pending"

    with pytest.raises(StaleOrderStatus):
        order.save()

    assert not RefusedWrite.objects.exists()


# -- a final timer's guard -----------------------------------------------------------------------------


@pytest.fixture
def saleor_expiry(redis_client: Any) -> Iterator[None]:
    registry.register(SaleorOrder, UnconfirmedOrderExpires)
    try:
        yield
    finally:
        registry.unregister(UnconfirmedOrderExpires.name)


def test_a_final_timers_refusal_is_recorded_with_its_timer(saleor_expiry):
    channel = Channel.objects.create(slug="default-channel", expire_orders_after=30)
    order = SaleorOrder.objects.create(channel=channel, created_at=timezone.now() - timedelta(minutes=31))
    SaleorOrder.objects.filter(pk=order.pk).update(status=OrderStatus.EXPIRED)  # as the expiry wrote it
    order = SaleorOrder.objects.get(pk=order.pk)
    order.status = OrderStatus.UNFULFILLED

    with pytest.raises(OrderClosed) as refused:
        order.save()

    # Every field the act writes, its time (``timers.NOW``) too: what this copy would have put back.
    assert refused_row(order) == ("saleorlike.Order", str(order.pk), UnconfirmedOrderExpires.name,
                                  "paid_after_close", {"status": "unfulfilled", "expired_at": None}, False)
    assert (refused.value.model_label, refused.value.timer) == ("saleorlike.Order", UnconfirmedOrderExpires.name)


# -- a record that cannot be written -----------------------------------------------------------------


@both_models
def test_a_refusal_is_still_raised_when_its_record_cannot_be_written(make_order, consumer, order_model, caplog):
    order = closed(make_order, consumer)

    with recording_database_unreachable(), caplog.at_level(logging.ERROR, logger="order_timeout"), \
            pytest.raises(OrderClosed, match="was already closed"), transaction.atomic():
        order.mark_paid()

    assert not RefusedWrite.objects.exists()
    (record,) = [r for r in caplog.records if r.getMessage().startswith("refused write not recorded")]
    assert record.levelno == logging.ERROR and "\n" not in record.getMessage()
    assert f"({order_model._meta.label} {order.pk}, timer close, paid_after_close)" in record.getMessage()


def test_the_next_refusal_is_recorded_once_the_database_answers_again(make_order, consumer):
    first, second = closed(make_order, consumer), closed(make_order, consumer)
    with recording_database_unreachable(), pytest.raises(OrderClosed), transaction.atomic():
        first.mark_paid()

    with pytest.raises(OrderClosed), transaction.atomic():
        second.mark_paid()

    assert list(RefusedWrite.objects.values_list("object_id", flat=True)) == [str(second.pk)]


# -- staff mark it handled -----------------------------------------------------------------------------


def test_marking_handled_counts_only_the_open_ones_once(make_order, consumer, admin_user):
    orders = [closed(make_order, consumer) for _ in range(3)]
    for order in orders:
        with pytest.raises(OrderClosed):
            order.mark_paid()
    now = timezone.now()

    assert RefusedWrite.objects.filter(object_id=str(orders[0].pk)).mark_handled(admin_user, now) == 1
    assert RefusedWrite.objects.all().mark_handled(admin_user, now) == 2
    assert RefusedWrite.objects.all().mark_handled(admin_user, now) == 0
    assert RefusedWrite.objects.open().count() == 0
    assert set(RefusedWrite.objects.values_list("handled_by", flat=True)) == {admin_user.pk}


def test_values_a_json_column_cannot_hold_are_recorded_as_text():
    from order_timeout.models import json_safe

    assert json_safe({"total": Decimal("10.50"), "what": object, "when": None}) == {
        "total": "10.50", "what": str(object), "when": None}
