"""The async faces (``amark_paid``, ``aextend_deadline``, ``aschedule``, ``aunschedule``) behave as
the sync calls they wrap, under a real ASGI request.

There is no pytest-asyncio here, so each test stays sync and drives the ASGI
app (or a coroutine) with ``async_to_sync``. That is also how a sync caller
meets these calls: the wrapped sync path runs on the test's own thread and
database connection, inside its transaction when there is one.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from asgiref.sync import async_to_sync
from django.db import transaction
from django.utils import timezone

from order_timeout import aschedule, aunschedule
from order_timeout.exceptions import OrderClosed
from order_timeout.timers.members import deadline_score

from .conftest import both_models
from .helpers import pending_count, score_of, set_state, state

pytestmark = pytest.mark.django_db(transaction=True)


def post(async_client: Any, path: str, data: dict[str, Any] | None = None) -> Any:
    """POST through the ASGI handler (``AsyncClient``), from this sync test."""
    return async_to_sync(async_client.post)(path, data or {})


def pay(async_client: Any, order: Any) -> Any:
    return post(async_client, f"/shop/orders/{order.pk}/pay")


# -- amark_paid ------------------------------------------------------------------


@both_models
def test_amark_paid_in_an_async_view_pays_and_unschedules_the_order(async_client, queue, make_order):
    order = make_order(in_seconds=600)
    assert score_of(queue, str(order.pk)) is not None

    response = pay(async_client, order)

    assert (response.status_code, response.json()["paid"]) == (200, True)
    assert state(order) == "paid"
    assert score_of(queue, str(order.pk)) is None


@both_models
def test_a_retried_payment_webhook_answers_not_paid_again_as_mark_paid_does(async_client, make_order):
    order = make_order(in_seconds=600)
    pay(async_client, order)

    response = pay(async_client, order)

    assert (response.status_code, response.json()["paid"]) == (200, False)
    assert state(order) == "paid"


@both_models
def test_a_webhook_for_an_order_its_deadline_closed_answers_409_so_the_provider_refunds(
        async_client, queue, make_order, consumer):
    order = make_order(in_seconds=-1)
    consumer().run(once=True)

    response = pay(async_client, order)

    assert (response.status_code, response.json()["error"]) == (409, "closed")
    assert state(order) == "closed"
    assert pending_count(queue) == 0


@both_models
def test_amark_paid_on_a_closed_order_raises_order_closed_as_mark_paid_does(make_order):
    order = make_order(in_seconds=600)
    set_state(order, "closed")

    with pytest.raises(OrderClosed):
        async_to_sync(order.amark_paid)()
    assert state(order) == "closed"


def test_amark_paid_inside_a_transaction_unschedules_the_order_only_when_it_commits(queue, make_order):
    order = make_order(in_seconds=600)

    with transaction.atomic():
        assert async_to_sync(order.amark_paid)() is True
        assert score_of(queue, str(order.pk)) is not None

    assert score_of(queue, str(order.pk)) is None


# -- aextend_deadline --------------------------------------------------------------


@both_models
def test_aextend_deadline_in_an_async_view_moves_the_score_at_once(async_client, queue, make_order,
                                                                   order_model):
    order = make_order(in_seconds=600)

    response = post(async_client, f"/shop/orders/{order.pk}/extend", {"seconds": 60})

    assert (response.status_code, response.json()["extended"]) == (200, True)
    sooner = order_model.objects.get(pk=order.pk).expires_at
    assert sooner < order.expires_at
    assert score_of(queue, str(order.pk)) == deadline_score(sooner)


@both_models
def test_aextend_deadline_of_a_closed_order_answers_409(async_client, make_order, consumer):
    order = make_order(in_seconds=-1)
    consumer().run(once=True)

    response = post(async_client, f"/shop/orders/{order.pk}/extend", {"seconds": 600})

    assert response.status_code == 409
    assert state(order) == "closed"


def test_aextend_deadline_refuses_a_naive_datetime_as_extend_deadline_does(make_order):
    order = make_order(in_seconds=600)

    with pytest.raises(ValueError, match="aware datetime"):
        async_to_sync(order.aextend_deadline)(timezone.now().replace(tzinfo=None))


# -- aschedule / aunschedule -------------------------------------------------------


@both_models
def test_aschedule_after_abulk_create_schedules_every_order(queue, order_model):
    deadline = timezone.now() + timedelta(minutes=5)

    async def create_then_schedule() -> list[Any]:
        orders = await order_model.objects.abulk_create([order_model(expires_at=deadline)
                                                         for _ in range(20)])
        await aschedule(orders)
        return orders

    orders = async_to_sync(create_then_schedule)()

    assert pending_count(queue) == 20
    assert {score_of(queue, str(order.pk)) for order in orders} == {deadline_score(deadline)}


@both_models
def test_aunschedule_after_aupdate_takes_the_orders_off_the_queue(queue, make_order, order_model):
    orders = [make_order(in_seconds=600) for _ in range(3)]

    async def pay_in_bulk() -> None:
        await (order_model.objects.filter(pk__in=[order.pk for order in orders])
               .aupdate(**{order_model.TIMEOUT_STATUS_FIELD: order_model.TIMEOUT_PAID_STATUS}))
        await aunschedule(orders)

    async_to_sync(pay_in_bulk)()

    assert pending_count(queue) == 0


@both_models
def test_aschedule_reads_a_queryset_off_the_event_loop(queue, make_order, order_model):
    """A QuerySet is evaluated on the sync path's thread: no ``SynchronousOnlyOperation``."""
    order = make_order(in_seconds=600)
    set_state(order, "paid")

    async_to_sync(aschedule)(order_model.objects.filter(pk=order.pk))

    assert score_of(queue, str(order.pk)) is None
