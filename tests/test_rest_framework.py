"""A shop's REST API (Django REST framework) answers the app's refusals with a 409 that names the order.

DRF renders its own ``APIException``s, ``Http404`` and ``PermissionDenied``; the app's refusals are
Django ``ValidationError``s, which it does not, so they were a 500. The optional handler
``order_timeout.contrib.rest_framework.exception_handler`` (the test project's ``REST_FRAMEWORK``)
answers ``OrderClosed`` and ``StaleOrderStatus`` with a 409 and leaves everything else to DRF.
Run against the test project's real DRF views: the shop's payment capture (``mark_paid()``) and the
ticket shop's payment confirmation (``testproject/shop/api.py``, ``testproject/tickets/api.py``).
"""

from __future__ import annotations

import subprocess
import sys
import threading
import tomllib
from typing import Any

import pytest

pytest.importorskip("rest_framework")

from django.db import connection  # noqa: E402
from django.http import Http404  # noqa: E402
from rest_framework.test import APIClient  # noqa: E402

from order_timeout.contrib.rest_framework import exception_handler  # noqa: E402
from order_timeout.models import RefusedWrite  # noqa: E402
from testproject.tickets import payments  # noqa: E402
from testproject.tickets.models import Payment, PaymentState, TicketOrder, TicketOrderStatus  # noqa: E402

from .conftest import PROJECT_ROOT, both_models, finish  # noqa: E402
from .test_import_layers import graph  # noqa: E402
from .test_ticket_shop import checkout, expiring, ticket_timers  # noqa: E402, F401 - fixtures

pytestmark = pytest.mark.django_db(transaction=True)

CLOSED = {
    "what_happened": "The order was closed by its deadline before this write; nothing was written.",
    "what_to_do": "Refund what was paid for it: a closed order is not paid any more.",
}


@pytest.fixture
def api() -> APIClient:
    return APIClient()


@both_models
def test_paying_an_order_its_deadline_closed_answers_409_naming_the_order(api, make_order, consumer,
                                                                          order_model):
    order = make_order(in_seconds=-1)
    consumer().run(once=True)

    response = api.post(f"/shop/api/orders/{order.pk}/pay")

    assert response.status_code == 409
    assert response.json() == {
        "code": "order_closed", "detail": f"{order_model.__name__} {order.pk!r} was already closed.",
        "order": {"model": order_model._meta.label, "pk": order.pk}, "timer": "close", **CLOSED}
    assert RefusedWrite.objects.open().filter(object_id=str(order.pk)).count() == 1


@both_models
def test_under_atomic_requests_a_409_rolls_back_what_the_request_wrote_before_the_refusal(
        api, make_order, consumer, monkeypatch):
    """The refusal becomes a response, not an exception: without the rollback DRF gives its own
    errors, the request's transaction would commit the payment it recorded beside the closed order."""
    order = make_order(in_seconds=-1)
    consumer().run(once=True)
    monkeypatch.setitem(connection.settings_dict, "ATOMIC_REQUESTS", True)

    response = api.post(f"/shop/api/orders/{order.pk}/pay")

    assert response.status_code == 409
    assert not order.payments.exists()  # the capture it recorded went with the request's transaction
    assert RefusedWrite.objects.open().filter(object_id=str(order.pk)).count() == 1  # written apart


def test_a_payment_whose_order_save_was_refused_answers_409_naming_the_order_and_its_timer(
        api, expiring, monkeypatch):  # noqa: F811
    order = checkout(in_seconds=-1)
    payment = Payment.objects.create(order=order)
    # The expiry commits while the provider captures the money: the order's copy is read before it.
    monkeypatch.setattr(payments, "capture_at_the_provider", lambda order: expiring())

    response = api.post(f"/tickets/api/payments/{payment.pk}/confirm")

    assert response.status_code == 409
    body = response.json()
    assert (body["code"], body["order"], body["timer"]) == (
        "stale_order_status", {"model": "tickets.TicketOrder", "pk": order.pk}, "ticket-order-expiry")
    assert body["detail"].startswith(f"TicketOrder {order.pk} was acted on by its timer 'ticket-order-expiry'")
    assert body["what_happened"] == ("The order was acted on by its timer ticket-order-expiry after this copy "
                                     "of it was read; nothing was written.")
    assert body["what_to_do"].startswith("Read the order again: what was taken for it meanwhile (a payment) "
                                         "is refunded")
    assert Payment.objects.get(pk=payment.pk).state == PaymentState.CONFIRMED
    assert TicketOrder.objects.get(pk=order.pk).status == TicketOrderStatus.EXPIRED
    assert RefusedWrite.objects.open().filter(object_id=str(order.pk)).count() == 1


def test_under_atomic_requests_a_refused_confirmation_leaves_no_payment_confirmed_but_its_record(
        api, expiring, monkeypatch):  # noqa: F811
    """In the request's transaction the payment's row is no longer committed apart: the refused save
    rolls it back with the rest, and only the record, written apart, stays."""
    order = checkout(in_seconds=-1)
    payment = Payment.objects.create(order=order)

    def expired_meanwhile(order: TicketOrder) -> None:
        # The expiry commits from another connection while the request's transaction is open.
        expiry = threading.Thread(target=lambda: (expiring(), connection.close()))
        expiry.start()
        finish(expiry)

    monkeypatch.setattr(payments, "capture_at_the_provider", expired_meanwhile)
    monkeypatch.setitem(connection.settings_dict, "ATOMIC_REQUESTS", True)

    response = api.post(f"/tickets/api/payments/{payment.pk}/confirm")

    assert response.status_code == 409
    assert Payment.objects.get(pk=payment.pk).state == PaymentState.CREATED  # rolled back with the request
    assert TicketOrder.objects.get(pk=order.pk).status == TicketOrderStatus.EXPIRED
    assert RefusedWrite.objects.open().filter(object_id=str(order.pk)).count() == 1


def test_a_payment_confirmed_in_time_answers_as_the_view_does(api, ticket_timers):  # noqa: F811
    order = checkout(in_seconds=600)
    payment = Payment.objects.create(order=order)

    response = api.post(f"/tickets/api/payments/{payment.pk}/confirm")

    assert (response.status_code, response.json()) == (200, {"payment": payment.pk, "result": "paid"})


def test_an_unknown_payment_still_gets_drfs_own_404(api):
    response = api.post("/tickets/api/payments/999999/confirm")

    assert response.status_code == 404 and set(response.json()) == {"detail"}


def test_a_method_the_view_has_not_still_gets_drfs_own_405(api):
    response = api.get("/tickets/api/payments/1/confirm")

    assert (response.status_code, response.json()) == (405, {"detail": 'Method "GET" not allowed.'})


def test_any_other_exception_is_left_to_drf_which_lets_it_through():
    context: dict[str, Any] = {}

    assert exception_handler(ValueError("a bug"), context) is None  # raised on: a 500, as before
    assert exception_handler(Http404("gone"), context).status_code == 404


def test_no_module_of_the_app_imports_the_handler_and_it_imports_without_drf():
    importers = [name for name, imports in graph().items()
                 if "order_timeout.contrib.rest_framework" in imports]
    hidden = ("import sys; sys.modules['rest_framework'] = None; import order_timeout.contrib.rest_framework; "
              "import order_timeout.exceptions")

    imported = subprocess.run([sys.executable, "-c", hidden], cwd=PROJECT_ROOT, capture_output=True, text=True)

    assert importers == []
    assert imported.returncode == 0, imported.stderr


def test_drf_is_a_test_dependency_and_never_the_packages():
    project = tomllib.loads((PROJECT_ROOT / "pyproject.toml").read_text())
    required = [*project["project"]["dependencies"], *sum(project["project"]["optional-dependencies"].values(), [])]

    assert not [name for name in required if name.lower().startswith("djangorestframework")]
    assert any(name.startswith("djangorestframework") for name in project["dependency-groups"]["test"])
