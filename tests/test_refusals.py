"""A move the app refuses reaches a shop's UI as an ordinary error, never as a server error.

Tried on Saleor: its ``orderConfirm`` racing the expiry answered "Internal Server Error" with code
``OrderClosed`` for 7 of 20 confirmations; ``OrderClosed`` was no error Saleor's mutations know.
Frameworks already turn a Django ``ValidationError`` into their own error answer (a form's errors,
a GraphQL mutation's error list, an API's 400): the app's refusals are ValidationErrors now, and
the admin and model forms show them as messages.
"""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.core.exceptions import ValidationError
from django.forms import modelform_factory
from django.urls import reverse
from django.utils import timezone

from order_timeout.exceptions import OrderClosed, OrderTimeoutError, StaleOrderStatus
from order_timeout.models import RefusedWrite
from order_timeout.timers.registry import registry
from testproject.saleorlike.expiry import UnconfirmedOrderExpires
from testproject.saleorlike.models import Channel, Order, OrderStatus
from testproject.saleorlike.mutations import order_confirm
from testproject.shop.models import ShopOrder

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.mark.parametrize(("refusal", "reason"), [(OrderClosed, "order_closed"),
                                                 (StaleOrderStatus, "stale_order_status")])
def test_a_refusal_is_a_validation_error_with_the_code_every_framework_knows(refusal, reason):
    error = refusal("Order 7 was closed by its deadline; it cannot be paid now.")

    assert isinstance(error, ValidationError) and isinstance(error, OrderTimeoutError)
    assert (error.code, error.reason) == ("invalid", reason)
    assert error.messages == ["Order 7 was closed by its deadline; it cannot be paid now."]
    assert error.message_alone == "Order 7 was closed by its deadline; it cannot be paid now."
    # str(): what was and was not written, too (a log line, a message shown to staff).
    assert str(error) == ("Order 7 was closed by its deadline; it cannot be paid now. This write was not made; "
                          "what was committed before it stands unless its transaction is rolled back.")


def closed_shop_order() -> ShopOrder:
    order = ShopOrder.objects.create(number="100", expires_at=timezone.now() - timedelta(minutes=1))
    ShopOrder.objects.filter(pk=order.pk).update(status="Cancelled", closed_at=timezone.now(), close_reason="timeout")
    return ShopOrder.objects.get(pk=order.pk)


def change_form(order: ShopOrder, **changes: str) -> dict[str, str]:
    return {"number": order.number, "status": order.status, "payment_method": order.payment_method,
            "total": str(order.total), "date_placed_0": order.date_placed.strftime("%Y-%m-%d"),
            "date_placed_1": order.date_placed.strftime("%H:%M:%S"), "expires_at_0": "", "expires_at_1": "",
            "completes_at_0": "", "completes_at_1": "", **changes}


@pytest.fixture
def shop_order_model(order_model):
    return order_model


@pytest.mark.parametrize("order_model", ["shop.ShopOrder"], indirect=True)
def test_paying_a_closed_order_in_its_admin_form_is_the_forms_error(admin_client, order_model):
    order = closed_shop_order()
    url = reverse("admin:shop_shoporder_change", args=[order.pk])

    response = admin_client.post(url, change_form(order, status="Paid"))

    assert response.status_code == 200  # the form again, with its error: no 500, no redirect
    assert "was closed by its deadline; it cannot be paid now." in response.content.decode()
    assert ShopOrder.objects.get(pk=order.pk).status == "Cancelled"


@pytest.mark.parametrize("order_model", ["shop.ShopOrder"], indirect=True)
def test_a_save_that_loses_the_race_in_the_admin_is_a_message_not_a_server_error(admin_client, order_model,
                                                                                 monkeypatch):
    """The form was valid (still unpaid when it was checked); the close came before its save."""
    order = ShopOrder.objects.create(number="101", expires_at=timezone.now() - timedelta(minutes=1))
    url = reverse("admin:shop_shoporder_change", args=[order.pk])
    checked = ShopOrder.clean

    def checked_then_closed(self):
        checked(self)
        ShopOrder.objects.filter(pk=self.pk).update(status="Cancelled", closed_at=timezone.now())

    monkeypatch.setattr(ShopOrder, "clean", checked_then_closed)
    response = admin_client.post(url, change_form(order, status="Paid"), follow=True)

    assert response.status_code == 200 and response.redirect_chain == [(url, 302)]
    refused = RefusedWrite.objects.get(object_id=str(order.pk))
    assert [str(message) for message in response.context["messages"]] == [
        f"ShopOrder {order.number} was closed by its deadline; it cannot be paid now. This write was not made; what "
        f"was committed before it stands unless its transaction is rolled back. Refused write #{refused.pk} "
        "records it for staff."]
    assert ShopOrder.objects.get(pk=order.pk).status == "Pending"  # nothing written: rolled back


@pytest.mark.parametrize("order_model", ["shop.ShopOrder"], indirect=True)
def test_a_model_form_paying_a_closed_order_is_invalid_with_the_refusal(order_model):
    order = closed_shop_order()
    form = modelform_factory(ShopOrder, fields=["status"])(instance=order, data={"status": "Paid"})

    assert not form.is_valid()
    assert form.non_field_errors() == [f"ShopOrder {order.number} was closed by its deadline; it cannot be paid now."]


@pytest.fixture
def saleor_expiry(redis_client):
    registry.register(Order, UnconfirmedOrderExpires)
    try:
        yield
    finally:
        registry.unregister(UnconfirmedOrderExpires.name)


def test_a_confirmation_after_the_expiry_is_an_ordinary_order_error_of_the_mutation(saleor_expiry):
    channel = Channel.objects.create(slug="default-channel", expire_orders_after=30)
    order = Order.objects.create(channel=channel, created_at=timezone.now() - timedelta(minutes=31))
    order.status = OrderStatus.UNCONFIRMED
    order.save()
    stale = Order.objects.get(pk=order.pk)  # staff opened it before the expiry
    Order.objects.filter(pk=order.pk).update(status=OrderStatus.EXPIRED)  # as the expiry wrote it

    answer = order_confirm(stale)

    assert answer["order"] is None
    assert [(error["field"], error["code"]) for error in answer["errors"]] == [(None, "INVALID")]
    assert "was acted on at its deadline" in answer["errors"][0]["message"]
    assert Order.objects.get(pk=order.pk).status == OrderStatus.EXPIRED
