"""The sorted set follows the order rows, after commit and only after commit."""

from __future__ import annotations

import logging
import time
from datetime import timedelta

import pytest
from django.db import transaction
from django.utils import timezone

from order_timeout import schedule, unschedule
from order_timeout.consumer import Consumer
from order_timeout.exceptions import OrderClosed, StaleOrderStatus
from order_timeout.models import Order
from order_timeout.timers.members import deadline_score

from .conftest import both_models, both_redis
from .helpers import pending_count, score_of, set_state, state

pytestmark = pytest.mark.django_db(transaction=True)


@both_redis
@both_models
def test_created_order_is_scheduled_at_its_deadline_in_ms(queue, make_order):
    order = make_order(in_seconds=600)

    assert score_of(queue, str(order.pk)) == deadline_score(order.expires_at)


def test_order_created_without_arguments_expires_after_default_timeout(queue, settings):
    settings.ORDER_TIMEOUT = {**settings.ORDER_TIMEOUT, "DEFAULT_TIMEOUT": 900}
    before = timezone.now()

    order = Order.objects.create()

    assert order.status == Order.Status.UNPAID
    assert before + timedelta(seconds=900) <= order.expires_at <= timezone.now() + timedelta(seconds=900)
    assert score_of(queue, str(order.pk)) == deadline_score(order.expires_at)


def test_score_is_rounded_up_so_a_member_is_never_due_before_its_row():
    deadline = timezone.now().replace(microsecond=123_456)

    assert deadline_score(deadline) == int(deadline.timestamp() * 1000) + 1


@both_redis
@both_models
def test_paid_order_leaves_the_queue(queue, make_order):
    order = make_order(in_seconds=600)

    assert order.mark_paid() is True

    assert score_of(queue, str(order.pk)) is None
    assert state(order) == "paid"


@both_models
def test_paying_twice_is_a_no_op(make_order, order_model):
    order = make_order(in_seconds=600)
    order.mark_paid()

    assert order_model.objects.get(pk=order.pk).mark_paid() is False


@both_models
def test_paying_a_closed_order_raises_so_the_shop_refunds(make_order):
    order = make_order(in_seconds=600)
    set_state(order, "closed")

    with pytest.raises(OrderClosed):
        order.mark_paid()
    assert state(order) == "closed"


def test_saving_a_paid_status_also_leaves_the_queue(queue, make_order):
    order = make_order(in_seconds=600)

    order.status = Order.Status.PAID
    order.save()

    assert score_of(queue, str(order.pk)) is None


def test_rolled_back_order_never_reaches_redis(queue, redis_client):
    with pytest.raises(RuntimeError), transaction.atomic():
        Order.objects.create()
        raise RuntimeError("checkout failed")

    assert redis_client.dbsize() == 0


def test_order_is_scheduled_only_when_the_transaction_commits(queue):
    with transaction.atomic():
        order = Order.objects.create()
        assert score_of(queue, str(order.pk)) is None

    assert score_of(queue, str(order.pk)) is not None


@both_models
def test_a_shortened_deadline_moves_the_score_at_once(queue, make_order):
    order = make_order(in_seconds=600)
    sooner = order.expires_at - timedelta(minutes=5)

    assert order.extend_deadline(sooner) is True

    assert score_of(queue, str(order.pk)) == deadline_score(sooner)


@both_models
def test_an_extended_deadline_is_taken_up_at_the_old_one_and_the_order_closes_at_the_new(
        queue, order_model):
    """Redis never holds a later deadline than the row: an extension waits in Redis at the
    old deadline, where the consumer reads the row and moves the member on. (Real time: the
    database's clock decides, so the test sleeps until each deadline.)"""
    first_deadline = timezone.now() + timedelta(seconds=0.5)
    order = order_model.objects.create(expires_at=first_deadline)
    later = first_deadline + timedelta(seconds=1)

    assert order.extend_deadline(later) is True
    assert score_of(queue, str(order.pk)) == deadline_score(first_deadline)

    sleep_until(first_deadline)
    first = Consumer().run(once=True)
    assert (first.closed, first.rescheduled) == (0, 1)
    assert score_of(queue, str(order.pk)) == deadline_score(later)
    assert state(order) == "unpaid"

    sleep_until(later)
    assert Consumer().run(once=True).closed == 1
    assert state(order) == "closed"


def sleep_until(moment):
    time.sleep(max(0.0, (moment - timezone.now()).total_seconds()) + 0.05)


@pytest.mark.django_db  # commits simulated: the test runs the captured on-commit steps itself
def test_two_deadline_changes_that_reach_redis_in_reverse_order_never_leave_the_later_one(
        queue, django_capture_on_commit_callbacks):
    """Two processes change one order's deadline; their commits' Redis writes cross on the way."""
    with django_capture_on_commit_callbacks(execute=True):
        order = Order.objects.create(expires_at=timezone.now() + timedelta(minutes=30))
    with django_capture_on_commit_callbacks() as first_commit:
        Order.objects.get(pk=order.pk).extend_deadline(timezone.now() + timedelta(minutes=60))
    with django_capture_on_commit_callbacks() as second_commit:
        Order.objects.get(pk=order.pk).extend_deadline(timezone.now() + timedelta(minutes=10))

    for write in [*second_commit, *first_commit]:  # the first commit's write arrives last
        write()

    row = Order.objects.get(pk=order.pk)
    assert score_of(queue, str(order.pk)) <= deadline_score(row.expires_at)


def test_saving_fields_unrelated_to_the_deadline_does_not_touch_redis(queue, make_order, redis_client):
    order = make_order(in_seconds=60)
    redis_client.delete(*(shard.keys.pending for shard in queue.shards))

    order.close_reason = "note"
    order.save(update_fields=["close_reason"])

    assert score_of(queue, str(order.pk)) is None


def test_bulk_created_orders_are_scheduled_by_schedule(queue):
    deadline = timezone.now() + timedelta(minutes=5)
    orders = Order.objects.bulk_create([Order(expires_at=deadline) for _ in range(50)])
    assert pending_count(queue) == 0

    schedule(orders)

    assert pending_count(queue) == 50
    assert {score_of(queue, str(o.pk)) for o in orders} == {deadline_score(deadline)}


def test_queryset_update_to_paid_is_followed_by_unschedule(queue, make_order):
    orders = [make_order(in_seconds=60) for _ in range(3)]
    Order.objects.filter(pk__in=[o.pk for o in orders]).update(status=Order.Status.PAID)

    unschedule(orders)

    assert pending_count(queue) == 0


@both_redis
def test_schedule_takes_orders_that_are_no_longer_unpaid_off_the_queue(queue, make_order):
    order = make_order(in_seconds=60)
    Order.objects.filter(pk=order.pk).update(status=Order.Status.PAID)

    schedule(Order.objects.filter(pk=order.pk))

    assert score_of(queue, str(order.pk)) is None


@both_redis
def test_schedule_of_a_mixed_list_adds_the_unpaid_and_drops_the_rest(queue, make_order, order_model):
    unpaid = [make_order(in_seconds=60) for _ in range(20)]
    paid = [make_order(in_seconds=60) for _ in range(20)]
    order_model.objects.filter(pk__in=[o.pk for o in paid]).update(status=order_model.Status.PAID)

    schedule(order_model.objects.filter(pk__in=[o.pk for o in [*unpaid, *paid]]))

    assert pending_count(queue) == 20
    assert all(score_of(queue, str(o.pk)) is None for o in paid)


def test_deleted_order_leaves_the_queue(queue, make_order):
    order = make_order(in_seconds=60)
    member = str(order.pk)

    order.delete()

    assert score_of(queue, member) is None


def test_order_is_saved_and_a_warning_logged_when_redis_is_down(private_redis, caplog):
    """Seed pitfall 6: the row commits even though ZADD cannot."""
    private_redis.stop()

    with caplog.at_level(logging.WARNING, logger="order_timeout"):
        order = Order.objects.create()

    assert Order.objects.filter(pk=order.pk, status=Order.Status.UNPAID).exists()
    assert any("compensation scan" in r.getMessage() and r.levelno == logging.WARNING
               for r in caplog.records)


def test_stale_copy_cannot_reopen_a_closed_order(make_order, queue):
    stale = make_order(in_seconds=60)
    Order.objects.filter(pk=stale.pk).update(status=Order.Status.CLOSED)

    stale.close_reason = "edited"
    with pytest.raises(StaleOrderStatus):
        stale.save()

    assert Order.objects.get(pk=stale.pk).status == Order.Status.CLOSED


def test_stale_copy_cannot_unpay_a_paid_order(make_order, queue):
    stale = make_order(in_seconds=60)
    Order.objects.get(pk=stale.pk).mark_paid()

    with pytest.raises(StaleOrderStatus):
        stale.save()

    assert Order.objects.get(pk=stale.pk).status == Order.Status.PAID
    assert score_of(queue, str(stale.pk)) is None


def test_saving_other_fields_of_a_closed_order_is_allowed(make_order):
    order = make_order(in_seconds=60)
    Order.objects.filter(pk=order.pk).update(status=Order.Status.CLOSED)

    order.close_reason = "fraud check"
    order.save(update_fields=["close_reason"])

    assert Order.objects.get(pk=order.pk).close_reason == "fraud check"
