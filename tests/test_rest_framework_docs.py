"""docs/existing-model.md's REST blocks, run as written against a DRF project with its own exception
handler and API-token authentication, and its 409 body checked against the one the view returns.

Seen in a ticket shop adopted from outside: its API set ``REST_FRAMEWORK["EXCEPTION_HANDLER"]`` to
its own handler and authenticated with tokens. The docs showed ``REST_FRAMEWORK = {...}`` alone:
pasted as printed it replaced the whole dict, and every call answered 403 "Authentication
credentials were not provided.". The docs now merge the key into the dict the project has, and
chain the app's answer into a handler the project has.
"""

from __future__ import annotations

import json
import re
import sys
import types
from collections.abc import Iterator
from typing import Any

import pytest

pytest.importorskip("rest_framework")

from django.contrib.auth.models import User  # noqa: E402
from django.test import override_settings  # noqa: E402
from django.urls import path  # noqa: E402
from rest_framework.authtoken.models import Token  # noqa: E402
from rest_framework.permissions import IsAuthenticated  # noqa: E402
from rest_framework.settings import api_settings  # noqa: E402
from rest_framework.test import APIClient  # noqa: E402

from order_timeout.models import RefusedWrite  # noqa: E402
from testproject.shop.api import PayOrder  # noqa: E402
from testproject.shop.models import ShopOrder  # noqa: E402

from .conftest import PROJECT_ROOT  # noqa: E402

pytestmark = pytest.mark.django_db(transaction=True)

DOC = PROJECT_ROOT / "docs" / "existing-model.md"
# The shop's own settings before it adopts the app: tokens, every view authenticated, its own handler.
SHOP_REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": ["rest_framework.authentication.TokenAuthentication"],
    "DEFAULT_PERMISSION_CLASSES": ["rest_framework.permissions.IsAuthenticated"],
}
NOT_PROVIDED = {"detail": "Authentication credentials were not provided."}


class ShopPayOrder(PayOrder):
    """The shop's payment view as its settings make it: DRF reads a view's authentication from the
    settings once, at import, so this reads them at each request; its permission is its own."""

    permission_classes = [IsAuthenticated]

    def get_authenticators(self) -> list[Any]:
        return [authentication() for authentication in api_settings.DEFAULT_AUTHENTICATION_CLASSES]


urlpatterns = [path("api/orders/<str:pk>/pay", ShopPayOrder.as_view())]


def rest_section() -> str:
    text = DOC.read_text()
    return text[text.index("## A REST API answers a refusal with 409"):text.index("## Running your own close")]


def blocks(language: str) -> list[str]:
    return re.findall(rf"```{language}\n(.*?)```", rest_section(), re.DOTALL)


@pytest.fixture
def shop_api() -> Iterator[APIClient]:
    with override_settings(ROOT_URLCONF=__name__):
        yield APIClient()


@pytest.fixture
def token() -> str:
    return Token.objects.create(user=User.objects.create_user("api-client")).key


# The shop's own order model, configured (and its saves scheduled) for the test.
on_the_shops_orders = pytest.mark.parametrize("order_model", ["shop.ShopOrder"], indirect=True, ids=["ShopOrder"])


@pytest.fixture
def closed_order(order_model: Any, make_order: Any, consumer: Any) -> ShopOrder:
    order = make_order(in_seconds=-1, number="A-1001")
    consumer().run(once=True)
    assert ShopOrder.objects.get(pk=order.pk).status == "Cancelled"
    return order


def merged_settings(block: str) -> dict[str, Any]:
    """The shop's settings.py with the block below its REST_FRAMEWORK, run as written."""
    namespace: dict[str, Any] = {"REST_FRAMEWORK": dict(SHOP_REST_FRAMEWORK)}
    exec(compile(block, "settings.py", "exec"), namespace)  # noqa: S102 - the docs' own block
    return dict(namespace["REST_FRAMEWORK"])


def shops_handler_module(block: str) -> str:
    """The block as the shop's handler module, importable by the dotted path its settings name."""
    module = types.ModuleType("yourshop_api_errors")
    exec(compile(block, "yourshop/api/errors.py", "exec"), module.__dict__)  # noqa: S102
    sys.modules[module.__name__] = module
    return f"{module.__name__}.exception_handler"


def normalized(body: dict[str, Any], order: ShopOrder) -> dict[str, Any]:
    """The body with this run's ids in place of the docs' (pk 1042, refused write #7)."""
    refused = RefusedWrite.objects.get(object_id=str(order.pk))
    text = json.dumps(body).replace(f"#{refused.pk}", "#7").replace(f'"pk": {order.pk}', '"pk": 1042')
    data = json.loads(text)
    data["refused_write"] = 7 if data["refused_write"] == refused.pk else data["refused_write"]
    return data


def test_the_docs_have_the_merge_the_chain_and_the_body():
    assert len(blocks("python")) == 2 and len(blocks("json")) == 1


@on_the_shops_orders
def test_the_block_that_replaced_the_dict_lost_the_token_authentication(shop_api, token, closed_order):
    """The finding, reproduced: the old block pasted below the shop's settings."""
    replaced = merged_settings('REST_FRAMEWORK = {"EXCEPTION_HANDLER": '
                               '"order_timeout.contrib.rest_framework.exception_handler"}')
    shop_api.credentials(HTTP_AUTHORIZATION=f"Token {token}")

    with override_settings(REST_FRAMEWORK=replaced):
        response = shop_api.post(f"/api/orders/{closed_order.pk}/pay")

    assert (response.status_code, response.json()) == (403, NOT_PROVIDED)


@on_the_shops_orders
def test_the_merge_block_keeps_the_token_authentication_and_answers_409(shop_api, token, closed_order):
    merged = merged_settings(blocks("python")[0])
    assert merged == {**SHOP_REST_FRAMEWORK,
                      "EXCEPTION_HANDLER": "order_timeout.contrib.rest_framework.exception_handler"}

    with override_settings(REST_FRAMEWORK=merged):
        anonymous = shop_api.post(f"/api/orders/{closed_order.pk}/pay")
        shop_api.credentials(HTTP_AUTHORIZATION=f"Token {token}")
        refused = shop_api.post(f"/api/orders/{closed_order.pk}/pay")

    assert (anonymous.status_code, anonymous.json()) == (401, NOT_PROVIDED)
    assert refused.status_code == 409
    assert normalized(refused.json(), closed_order) == json.loads(blocks("json")[0])  # the docs' body


@on_the_shops_orders
def test_the_chained_handler_answers_409_and_keeps_the_shops_own_answers(shop_api, token, closed_order,
                                                                         make_order):
    handler = shops_handler_module(blocks("python")[1])
    paid_in_time = make_order(in_seconds=600, number="A-1002")

    with override_settings(REST_FRAMEWORK={**SHOP_REST_FRAMEWORK, "EXCEPTION_HANDLER": handler}):
        anonymous = shop_api.post(f"/api/orders/{closed_order.pk}/pay")
        shop_api.credentials(HTTP_AUTHORIZATION=f"Token {token}")
        missing = shop_api.post("/api/orders/999999/pay")
        refused = shop_api.post(f"/api/orders/{closed_order.pk}/pay")
        paid = shop_api.post(f"/api/orders/{paid_in_time.pk}/pay")

    assert (anonymous.status_code, anonymous.json()) == (401, {"error": NOT_PROVIDED})  # the shop's envelope
    assert (missing.status_code, missing.json()) == (404, {"error": {"detail": "No ShopOrder matches the given "
                                                                                "query."}})
    assert refused.status_code == 409
    assert normalized(refused.json()["error"], closed_order) == json.loads(blocks("json")[0])
    assert (paid.status_code, paid.json()) == (200, {"order": str(paid_in_time.pk), "paid": True})
