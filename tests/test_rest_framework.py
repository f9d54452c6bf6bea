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
from testproject.shop.models import ShopOrder  # noqa: E402
from testproject.tickets import payments  # noqa: E402
from testproject.tickets.models import Payment, PaymentState, TicketOrder, TicketOrderStatus  # noqa: E402

from .conftest import PROJECT_ROOT, both_models, finish  # noqa: E402
from .test_import_layers import graph  # noqa: E402
from .test_ticket_shop import checkout, expiring, ticket_timers  # noqa: E402, F401 - fixtures

pytestmark = pytest.mark.django_db(transaction=True)

WRITES_STAND = ("What this request committed before the refusal stands (a payment's confirmation, a log entry): "
                "it was not rolled back.")
ROLLED_BACK = "Nothing else this request wrote was kept: its transaction was rolled back."
NOT_MADE = "This write was not made; what was committed before it stands unless its transaction is rolled back."


def closed_body(refused_write: int, *, rolled_back: bool = False) -> dict[str, Any]:
    """The words of an ``OrderClosed`` 409: what was and was not written, and the record staff see."""
    return {
        "written": {"refused_write": False, "request_rolled_back": rolled_back},
        "refused_write": refused_write,
        "what_happened": "The order was closed by its deadline before this write. The refused write was not made. "
                         + (ROLLED_BACK if rolled_back else WRITES_STAND),
        "what_to_do": "Refund what was paid for it: a closed order is not paid any more. Staff see this refusal "
                      f"as refused write #{refused_write}.",
    }


@pytest.fixture
def api() -> APIClient:
    return APIClient()


@both_models
def test_paying_an_order_its_deadline_closed_answers_409_naming_the_order_and_what_stands(
        api, make_order, consumer, order_model):
    """Seen: the 409 said nothing was written while the capture the request had recorded (and
    committed: no ATOMIC_REQUESTS) stood. It says now that the refused write was not made, that
    what the request committed before it stands, and which refused write staff see."""
    order = make_order(in_seconds=-1, **({"number": "A-1001"} if order_model is ShopOrder else {}))
    consumer().run(once=True)

    response = api.post(f"/shop/api/orders/{order.pk}/pay")

    refused = RefusedWrite.objects.open().get(object_id=str(order.pk))
    name = "A-1001" if order_model is ShopOrder else str(order.pk)
    assert response.status_code == 409
    assert response.json() == {
        "code": "order_closed", "detail": f"{order_model.__name__} {name} was already closed. {NOT_MADE} Refused "
                                          f"write #{refused.pk} records it for staff.",
        "order": {"model": order_model._meta.label, "pk": order.pk, "name": name}, "timer": "close",
        **closed_body(refused.pk)}
    assert order.payments.count() == 1  # the capture the request committed first: it stands, as the body says
    assert refused.public_name == name


def deferred_foreign_keys(model: Any) -> list[str]:
    """PostgreSQL: the table's foreign keys checked only at COMMIT (Django creates them DEFERRABLE
    INITIALLY DEFERRED); MariaDB checks every one at once, and has none."""
    if connection.vendor != "postgresql":
        return []
    with connection.cursor() as cursor:
        cursor.execute("SELECT conname FROM pg_constraint WHERE conrelid = %s::regclass AND contype = 'f' "
                       "AND condeferred", [model._meta.db_table])
        return [name for name, in cursor.fetchall()]


@both_models
def test_under_atomic_requests_a_409_rolls_back_what_the_request_wrote_before_the_refusal(
        api, make_order, consumer, monkeypatch, order_model):
    """The refusal becomes a response, not an exception: without the rollback DRF gives its own
    errors, the request's transaction would commit the payment it recorded beside the closed order.
    On PostgreSQL the payment's foreign key to the order is checked only at COMMIT: the rollback
    must leave nothing for a later commit to check, and the connection must serve the next request."""
    order = make_order(in_seconds=-1)
    consumer().run(once=True)
    monkeypatch.setitem(connection.settings_dict, "ATOMIC_REQUESTS", True)
    payment_model = order_model.payments.rel.related_model

    responses = [api.post(f"/shop/api/orders/{order.pk}/pay") for _ in range(2)]

    first, second = RefusedWrite.objects.filter(object_id=str(order.pk)).order_by("pk")
    assert [response.status_code for response in responses] == [409, 409]
    assert responses[0].json()["written"] == {"refused_write": False, "request_rolled_back": True}
    assert responses[0].json()["what_happened"].endswith(ROLLED_BACK)
    assert [response.json()["refused_write"] for response in responses] == [first.pk, second.pk]
    assert not order.payments.exists()  # the capture it recorded went with the request's transaction
    assert (connection.vendor != "postgresql") == (deferred_foreign_keys(payment_model) == [])


def test_a_payment_whose_order_save_was_refused_answers_409_naming_the_order_and_its_timer(
        api, expiring, monkeypatch):  # noqa: F811
    order = checkout(in_seconds=-1)
    payment = Payment.objects.create(order=order)
    # The expiry commits while the provider captures the money: the order's copy is read before it.
    monkeypatch.setattr(payments, "capture_at_the_provider", lambda order: expiring())

    response = api.post(f"/tickets/api/payments/{payment.pk}/confirm")

    refused = RefusedWrite.objects.open().get(object_id=str(order.pk))
    assert response.status_code == 409
    body = response.json()
    assert (body["code"], body["order"], body["timer"], body["refused_write"]) == (
        "stale_order_status", {"model": "tickets.TicketOrder", "pk": order.pk, "name": order.code},
        "ticket-order-expiry", refused.pk)
    assert order.code == f"API{order.pk:04d}"  # the timer's public_name: the code its API knows
    assert body["detail"].startswith(f"TicketOrder {order.code} was acted on by its timer 'ticket-order-expiry'")
    assert body["detail"].endswith(f"{NOT_MADE} Refused write #{refused.pk} records it for staff.")
    # The shop committed the payment's confirmation before the order's save was refused: it stands.
    assert body["what_happened"] == ("The order was acted on by its timer ticket-order-expiry after this copy "
                                     f"of it was read. The refused write was not made. {WRITES_STAND}")
    assert body["written"] == {"refused_write": False, "request_rolled_back": False}
    assert refused.public_name == order.code
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
    assert response.json()["written"] == {"refused_write": False, "request_rolled_back": True}
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
