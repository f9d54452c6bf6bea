"""The Redis copy follows committed rows: never a later deadline than the row, whatever happens."""

from __future__ import annotations

import logging
import threading
import uuid
from datetime import timedelta

import pytest
import redis
from django.db import connection, transaction
from django.utils import timezone
from hypothesis import HealthCheck, example, given, settings as hypothesis_settings, strategies as st

from order_timeout.conf import settings as order_settings
from order_timeout.consumer import Consumer
from order_timeout.exceptions import OrderClosed, StaleOrderStatus
from order_timeout.models import Order
from order_timeout.queue import TimeoutQueue
from order_timeout.timers.members import deadline_score, order_member
from testproject.shop.models import SoftDeleteOrder, UuidOrder

from .conftest import finish, wait_for
from .helpers import RecordingConnection, Traffic, expiries, hash_size, keys_for, leased_members, score_of

pytestmark = pytest.mark.django_db(transaction=True)


def in_minutes(minutes: float):
    return timezone.now() + timedelta(minutes=minutes)


class CheckoutFailed(Exception):
    pass


def test_a_rolled_back_save_then_a_retried_save_schedules_the_new_deadline(queue):
    order = Order.objects.create(expires_at=in_minutes(60))
    order.expires_at = in_minutes(5)

    with pytest.raises(CheckoutFailed), transaction.atomic():
        order.save()
        raise CheckoutFailed
    order.save()  # the request is retried with the same object

    assert score_of(queue, str(order.pk)) == deadline_score(order.expires_at)
    assert Order.objects.get(pk=order.pk).expires_at == order.expires_at


def test_a_stale_copy_saved_after_extend_deadline_keeps_the_extended_deadline(queue):
    order = Order.objects.create(expires_at=in_minutes(5))
    stale = Order.objects.get(pk=order.pk)
    extended = in_minutes(60)
    Order.objects.get(pk=order.pk).extend_deadline(extended)

    stale.close_reason = "note from the dashboard"
    stale.save()

    row = Order.objects.get(pk=order.pk)
    assert (row.expires_at, row.close_reason) == (extended, "note from the dashboard")
    # The extension waits in Redis at the old deadline (ZADD LT), where the consumer takes it up.
    assert score_of(queue, str(order.pk)) == deadline_score(order.expires_at)


def test_a_copy_that_sets_its_own_deadline_still_wins(queue):
    order = Order.objects.create(expires_at=in_minutes(5))
    copy = Order.objects.get(pk=order.pk)
    Order.objects.get(pk=order.pk).extend_deadline(in_minutes(60))

    first = order.expires_at
    copy.expires_at = in_minutes(10)
    copy.save()

    assert Order.objects.get(pk=order.pk).expires_at == copy.expires_at
    # Never later than the row: still at the first deadline, taken up by the consumer there.
    assert score_of(queue, str(order.pk)) == deadline_score(first) <= deadline_score(copy.expires_at)


@pytest.mark.parametrize("order_model", ["shop.UuidOrder"], indirect=True)
@pytest.mark.parametrize("spelling", [str.upper, lambda text: uuid.UUID(text).hex],
                         ids=["upper-case", "hex"])
def test_a_uuid_primary_key_given_as_other_text_is_scheduled_and_closed(order_model, queue, consumer,
                                                                       spelling):
    key = str(uuid.uuid4())
    order = UuidOrder.objects.create(id=spelling(key), expires_at=timezone.now() - timedelta(seconds=1))

    assert score_of(queue, key) == deadline_score(order.expires_at)
    stats = consumer().run(once=True)

    assert (stats.closed, stats.dropped) == (1, 0)
    assert UuidOrder.objects.get(pk=key).status == "closed"
    assert order_member(UuidOrder, spelling(key)) == key


@pytest.mark.parametrize("order_model", ["shop.SoftDeleteOrder"], indirect=True)
def test_a_default_manager_that_hides_rows_does_not_hide_them_from_the_app(order_model, queue,
                                                                          consumer):
    due = SoftDeleteOrder.objects.create(expires_at=timezone.now() - timedelta(seconds=1))
    later = SoftDeleteOrder.objects.create(expires_at=in_minutes(30))
    SoftDeleteOrder.every.filter(pk__in=[due.pk, later.pk]).update(hidden=True)

    stats = consumer().run(once=True)

    assert (stats.closed, stats.dropped) == (1, 0) and expiries(due) == 1
    assert SoftDeleteOrder.every.get(pk=due.pk).status == "closed"
    assert later.mark_paid() is True  # no DoesNotExist for a hidden row


def test_a_stale_consumers_ack_cannot_strip_a_newer_lease(queue):
    now = 1_000_000
    queue.schedule({"7": now - 1})
    shard = queue.shard_for("7")
    stale = shard.claim(now, 10, now + 50, "stale-consumer")   # its lease runs out at +50 ms
    newer = shard.claim(now + 60, 10, now + 30_000, "newer-consumer")  # taken over

    queue.ack(stale.token, ["7"])
    queue.reschedule(stale.token, {"7": now + 1_000})
    queue.retry(stale.token, ["7"], now + 100, [1_000])

    assert newer.members == ["7"] and newer.takeovers == 1
    assert leased_members(queue) == ["7"]
    assert queue.client.hget(keys_for(queue, "7").owners, "7") == b"newer-consumer"
    assert queue.client.hget(keys_for(queue, "7").attempts, "7") is None
    queue.ack(newer.token, ["7"])
    assert leased_members(queue) == [] and hash_size(queue, "takeovers") == 0


@pytest.fixture
def recorded_queue(settings, private_redis):
    """The queue's alias on a pool of its own whose connections record their round trips, on a
    private Redis: the test pauses the whole server, which would stall every other test's too."""
    traffic = Traffic()
    location = private_redis.url
    # A URL of its own: django-redis shares one pool per URL.
    url = f"{location}{'&' if '?' in location else '?'}client_name=recorded-{uuid.uuid4().hex[:8]}"
    options = {**settings.CACHES["order_timeout"].get("OPTIONS", {}),
               "CONNECTION_POOL_KWARGS": {"connection_class": RecordingConnection, "traffic": traffic}}
    settings.CACHES = {**settings.CACHES, "recorded": {"BACKEND": "django_redis.cache.RedisCache",
                                                       "LOCATION": url, "OPTIONS": options}}
    settings.ORDER_TIMEOUT = {**settings.ORDER_TIMEOUT, "REDIS_ALIAS": "recorded"}
    yield traffic


@pytest.mark.parametrize("pooled", [True, False], ids=["pooled-connection", "new-connection"])
def test_a_save_with_redis_paused_returns_within_the_bound(recorded_queue, private_redis, caplog, pooled):
    """Port open, no answer: the order commits after one round trip that waited SCHEDULE_TIMEOUT
    and no more (no retry), then a warning. The docs' bound, about three round trips of
    SCHEDULE_TIMEOUT at most, counts the new connection's and a script reload."""
    traffic = recorded_queue
    ready, go = threading.Event(), threading.Event()

    def web_request():
        try:
            if pooled:  # this thread saved an order before: its connection is open, the script loaded
                Order.objects.create(expires_at=in_minutes(30))
            ready.set()
            go.wait()
            Order.objects.create(expires_at=in_minutes(30))
        finally:
            connection.close()

    request = threading.Thread(target=web_request, name="the request")
    request.start()
    wait_for(lambda: ready.is_set() or not request.is_alive())
    before = len(traffic.trips)
    # Redis answers no write until told: only the save's own bounds end its wait.
    redis_client = redis.Redis.from_url(private_redis.url)
    redis_client.execute_command("CLIENT", "PAUSE", 60_000, "WRITE")
    try:
        with caplog.at_level(logging.WARNING, logger="order_timeout"):
            go.set()
            finish(request)
    finally:
        redis_client.execute_command("CLIENT", "UNPAUSE")

    during_the_save = traffic.trips[before:]
    waited = [trip for trip in during_the_save if trip.outcome == "timed out"]
    assert [(trip.commands, trip.thread) for trip in waited] == [(("EVALSHA",), "the request")]
    assert len([trip for trip in during_the_save if not trip.handshake]) <= 3
    assert {trip.socket_timeout for trip in during_the_save} == {order_settings.SCHEDULE_TIMEOUT}
    assert Order.objects.count() == 1 + pooled
    assert "Could not update the queue close" in caplog.text and "Timeout" in caplog.text


# -- a property: whatever the interleaving, Redis never holds a later deadline than the row ----


OFFSETS_MINUTES = st.sampled_from([-1, 5, 30, 120])
OPERATIONS = st.lists(st.one_of(
    st.tuples(st.just("create"), OFFSETS_MINUTES, st.booleans()),
    st.tuples(st.just("save"), st.integers(0, 3), OFFSETS_MINUTES, st.booleans()),
    st.tuples(st.just("resave"), st.integers(0, 3)),
    st.tuples(st.just("extend"), st.integers(0, 3), OFFSETS_MINUTES),
    st.tuples(st.just("stale_save"), st.integers(0, 3)),
    st.tuples(st.just("pay"), st.integers(0, 3)),
    st.tuples(st.just("close"),),
), min_size=1, max_size=14)


class Shop:
    """Orders as a request would hold them: a live copy, and one loaded at creation (stale)."""

    def __init__(self) -> None:
        self.live: list[Order] = []
        self.stale: list[Order] = []

    def apply(self, operation: tuple) -> None:
        kind, *args = operation
        try:
            getattr(self, kind)(*args)
        except (StaleOrderStatus, OrderClosed, CheckoutFailed, IndexError):
            pass  # refused, rolled back, or no such order yet

    def create(self, minutes: int, roll_back: bool) -> None:
        with transaction.atomic():
            order = Order.objects.create(expires_at=in_minutes(minutes))
            if roll_back:
                raise CheckoutFailed
        self.live.append(order)
        self.stale.append(Order.objects.get(pk=order.pk))

    def save(self, index: int, minutes: int, roll_back: bool) -> None:
        order = self.live[index]
        order.expires_at = in_minutes(minutes)
        with transaction.atomic():
            order.save()
            if roll_back:
                raise CheckoutFailed

    def resave(self, index: int) -> None:
        self.live[index].save()

    def extend(self, index: int, minutes: int) -> None:
        Order.objects.get(pk=self.live[index].pk).extend_deadline(in_minutes(minutes))

    def stale_save(self, index: int) -> None:
        stale = self.stale[index]
        stale.close_reason = "edited"
        stale.save()

    def pay(self, index: int) -> None:
        Order.objects.get(pk=self.live[index].pk).mark_paid()

    def close(self) -> None:
        Consumer().run(once=True)


def assert_redis_follows_the_rows(queue: TimeoutQueue) -> None:
    for row in Order.objects.all():
        member = str(row.pk)
        where = queue.positions([member])[member]
        if row.status == "unpaid":
            assert where.lease_ms is not None or (
                where.pending_ms is not None and where.pending_ms <= deadline_score(row.expires_at)
            ), (row.pk, row.expires_at, where)
        else:
            assert where.pending_ms is None and where.lease_ms is None, (row.pk, row.status, where)


@hypothesis_settings(max_examples=60, deadline=None,
                     suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(operations=OPERATIONS)
# The interleavings the fault runs found, always among the examples:
@example(operations=[("create", 120, False), ("save", 0, 5, True), ("resave", 0)])
@example(operations=[("create", 5, False), ("extend", 0, 120), ("stale_save", 0)])
@example(operations=[("create", -1, False), ("close",), ("stale_save", 0), ("pay", 0)])
def test_redis_never_holds_a_later_deadline_than_the_row(queue, operations):
    Order.objects.all().delete()
    queue.client.flushdb()
    shop = Shop()

    for operation in operations:
        shop.apply(operation)
        assert_redis_follows_the_rows(queue)

