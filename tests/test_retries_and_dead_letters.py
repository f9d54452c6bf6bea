"""Failed closes back off, then become dead letters that staff resolve from the admin."""

from __future__ import annotations

import logging
from contextlib import contextmanager
from datetime import timedelta

import pytest
from django.contrib.auth.models import Permission, User
from django.urls import reverse
from django.utils import timezone

from order_timeout.models import DeadLetter, Order
from order_timeout.signals import order_expired
from order_timeout.timers.members import now_score
from testproject.shop.models import Expiry

from .helpers import hash_size, keys_for, leased_members, pending_count, rename_table, score_of, set_state

pytestmark = pytest.mark.django_db(transaction=True)

CHANGELIST = "admin:order_timeout_deadletter_changelist"


class StockServiceDown(Exception):
    pass


@pytest.fixture
def failing_receiver():
    """An order_expired receiver that raises for the order ids in ``failing``."""
    failing: set[int] = set()
    calls: list[int] = []

    def release_stock(sender, order, **kwargs):
        calls.append(order.pk)
        if order.pk in failing:
            raise StockServiceDown(f"cannot release stock of order {order.pk}")

    order_expired.connect(release_stock, weak=False)
    release_stock.failing, release_stock.calls = failing, calls
    yield release_stock
    order_expired.disconnect(release_stock)


@pytest.fixture
def short_retries(settings):
    settings.ORDER_TIMEOUT = {**settings.ORDER_TIMEOUT, "RETRY_DELAYS": [1, 2, 4]}


@pytest.fixture
def order_in_backoff(short_retries, failing_receiver, consumer, make_order):
    """An overdue order whose first close failed: it waits for its first retry, 1 s on.

    Its receiver is healed again afterwards, so the retry succeeds unless a test says otherwise.
    """
    order = make_order(in_seconds=-1)
    failing_receiver.failing.add(order.pk)
    consumer().run(once=True)
    failing_receiver.failing.clear()
    return order


@pytest.fixture
def dead_letter(short_retries, failing_receiver, consumer, make_order, clock):
    """An overdue order driven through every retry until dead-lettered: (order, letter).

    Its receiver is healed again afterwards, so an action that closes it succeeds.
    """
    order = make_order(in_seconds=-1)
    failing_receiver.failing.add(order.pk)
    worker = consumer()
    worker.run(once=True)
    for delay in (1, 2, 4):
        clock.advance(delay)
        worker.run(once=True)
    failing_receiver.failing.clear()
    return order, DeadLetter.objects.get(order_id=str(order.pk))


def test_receiver_that_keeps_raising_is_retried_at_each_delay_then_dead_lettered(
        short_retries, failing_receiver, consumer, make_order, queue, clock):
    order = make_order(in_seconds=-1)
    failing_receiver.failing.add(order.pk)
    worker = consumer()
    member = str(order.pk)

    retry_scores = []
    worker.run(once=True)
    for delay in (1, 2, 4):
        retry_scores.append(score_of(queue, member) - now_score(clock()))
        clock.advance(delay - 0.001)
        worker.run(once=True)  # not yet: the retry waits its delay
        assert len(failing_receiver.calls) == 1 + len(retry_scores) - 1
        clock.advance(0.001)
        worker.run(once=True)

    assert retry_scores == [1000, 2000, 4000]
    assert len(failing_receiver.calls) == 4  # the first try and three retries
    letter = DeadLetter.objects.get()
    assert (letter.order_id, letter.attempts) == (member, 4)
    assert letter.error_type.endswith("StockServiceDown")
    assert f"cannot release stock of order {order.pk}" in letter.last_error
    assert letter.first_failed_at < letter.last_failed_at
    assert not letter.is_resolved
    assert Order.objects.get(pk=order.pk).status == Order.Status.UNPAID
    # It left Redis: nothing pending, leased or counted.
    assert pending_count(queue) == 0 and leased_members(queue) == []
    assert hash_size(queue, "attempts") == 0
    assert worker.stats.dead_lettered == 1


def test_retry_state_survives_a_consumer_restart(short_retries, failing_receiver, consumer,
                                                 make_order, queue, clock):
    order = make_order(in_seconds=-1)
    failing_receiver.failing.add(order.pk)
    consumer().run(once=True)
    clock.advance(1)
    consumer().run(once=True)

    clock.advance(2)
    consumer().run(once=True)  # a third consumer: attempt 3, so the next delay is 4 s

    assert score_of(queue, str(order.pk)) == now_score(clock()) + 4000
    assert int(queue.client.hget(keys_for(queue, str(order.pk)).attempts, str(order.pk))) == 3


def test_successful_retry_clears_the_retry_state(order_in_backoff, consumer, queue, clock):
    clock.advance(1)
    consumer().run(once=True)

    assert Order.objects.get(pk=order_in_backoff.pk).status == Order.Status.CLOSED
    assert hash_size(queue, "attempts") == 0
    assert not DeadLetter.objects.exists()


def test_order_paid_during_its_backoff_is_never_closed(order_in_backoff, consumer, queue, clock):
    Order.objects.get(pk=order_in_backoff.pk).mark_paid()
    clock.advance(1)
    consumer().run(once=True)

    assert Order.objects.get(pk=order_in_backoff.pk).status == Order.Status.PAID
    assert pending_count(queue) == 0 and hash_size(queue, "attempts") == 0


def staff(username, *permissions):
    user = User.objects.create_user(username, password="pw", is_staff=True)
    user.user_permissions.add(
        Permission.objects.get(codename="view_deadletter"),
        *(Permission.objects.get(content_type__app_label="order_timeout", codename=codename)
          for codename in permissions),
    )
    return user


def post_action(client, action, letter):
    return client.post(reverse(CHANGELIST), {"action": action, "_selected_action": [letter.pk]},
                       follow=True)


def test_requeue_from_the_admin_closes_the_order(dead_letter, consumer, client):
    order, letter = dead_letter
    client.force_login(staff("ops", "requeue_deadletter"))

    response = post_action(client, "requeue", letter)

    assert "1 order requeued." in response.text
    letter.refresh_from_db()
    assert letter.resolution == DeadLetter.Resolution.REQUEUED
    assert letter.resolved_by.username == "ops" and letter.is_resolved
    consumer().run(once=True)
    assert Order.objects.get(pk=order.pk).status == Order.Status.CLOSED
    assert Expiry.objects.filter(order_id=str(order.pk)).count() == 1


def test_requeue_needs_the_permission(dead_letter, queue, client):
    order, letter = dead_letter
    client.force_login(staff("intern"))

    changelist = client.get(reverse(CHANGELIST))
    post_action(client, "requeue", letter)

    assert changelist.status_code == 200
    assert 'value="requeue"' not in changelist.text
    letter.refresh_from_db()
    assert not letter.is_resolved
    assert pending_count(queue) == 0


def test_close_now_closes_the_order_through_the_consumers_path(dead_letter, client):
    order, letter = dead_letter
    client.force_login(staff("ops", "close_deadletter_order"))

    response = post_action(client, "close_now", letter)

    assert "1 order closed." in response.text
    order.refresh_from_db()
    assert (order.status, order.close_reason) == (Order.Status.CLOSED, "timeout")
    assert Expiry.objects.filter(order_id=str(order.pk)).count() == 1  # the signal fired
    letter.refresh_from_db()
    assert letter.resolution == DeadLetter.Resolution.CLOSED


def test_close_now_never_closes_an_order_paid_meanwhile(dead_letter, client):
    order, letter = dead_letter
    Order.objects.get(pk=order.pk).mark_paid()
    client.force_login(staff("ops", "close_deadletter_order", "requeue_deadletter"))

    close_response = post_action(client, "close_now", letter)

    assert "already paid or closed" in close_response.text
    assert Order.objects.get(pk=order.pk).status == Order.Status.PAID
    letter.refresh_from_db()
    assert letter.resolution == DeadLetter.Resolution.SETTLED


def test_requeue_never_schedules_an_order_paid_meanwhile(dead_letter, queue, client):
    order, letter = dead_letter
    Order.objects.get(pk=order.pk).mark_paid()
    client.force_login(staff("ops", "requeue_deadletter"))

    post_action(client, "requeue", letter)

    assert pending_count(queue) == 0
    assert Order.objects.get(pk=order.pk).status == Order.Status.PAID


def test_close_now_that_fails_again_keeps_the_dead_letter_open(dead_letter, failing_receiver, client):
    order, letter = dead_letter
    failing_receiver.failing.add(order.pk)  # the cause was not fixed
    client.force_login(staff("ops", "close_deadletter_order"))

    response = post_action(client, "close_now", letter)

    assert "failed to close again" in response.text
    letter.refresh_from_db()
    assert not letter.is_resolved and letter.attempts == 5
    assert Order.objects.get(pk=order.pk).status == Order.Status.UNPAID


def test_dead_letter_changelist_searches_and_filters(dead_letter, admin_client):
    found = admin_client.get(reverse(CHANGELIST), {"q": "StockServiceDown", "resolved": "no"})
    not_found = admin_client.get(reverse(CHANGELIST), {"resolved": "yes"})

    assert found.status_code == 200
    assert len(found.context["cl"].result_list) == 1
    assert len(not_found.context["cl"].result_list) == 0


def test_close_now_needs_the_permission(dead_letter, client):
    order, letter = dead_letter
    client.force_login(staff("intern", "requeue_deadletter"))

    changelist = client.get(reverse(CHANGELIST))
    post_action(client, "close_now", letter)

    assert 'value="close_now"' not in changelist.text and 'value="requeue"' in changelist.text
    assert Order.objects.get(pk=order.pk).status == Order.Status.UNPAID
    letter.refresh_from_db()
    assert not letter.is_resolved


def test_each_batch_and_each_failure_is_logged_in_one_line(short_retries, failing_receiver, consumer,
                                                           make_order, clock, caplog):
    failing = make_order(in_seconds=-1)
    make_order(in_seconds=-1)
    failing_receiver.failing.add(failing.pk)

    with caplog.at_level(logging.INFO, logger="order_timeout"):
        consumer().run(once=True)

    batches = [r for r in caplog.records if r.getMessage().startswith("close claimed=")]
    failures = [r for r in caplog.records if r.getMessage().startswith("close failed ")]
    assert len(batches) == 1 and len(failures) == 1
    assert failures[0].exc_info is None  # one line: the traceback goes with the give-up, and at DEBUG
    assert batches[0].batch == {**batches[0].batch, "claimed": 2, "closed": 1, "skipped_paid": 0,
                                "rescheduled": 0, "failed": 1, "dead_lettered": 0}
    assert "elapsed_ms=" in batches[0].getMessage()
    assert failures[0].order_id == str(failing.pk) and failures[0].attempt == 1
    assert "error=StockServiceDown" in failures[0].getMessage()
    assert "next=retry in 1s" in failures[0].getMessage()


def test_saving_an_order_during_its_backoff_keeps_the_retry_time(order_in_backoff, queue):
    member = str(order_in_backoff.pk)
    retry_at = score_of(queue, member)

    Order.objects.get(pk=order_in_backoff.pk).save()

    assert score_of(queue, member) == retry_at


def test_close_now_of_an_extended_order_with_redis_down_reports_it_instead_of_a_500(
        dead_letter, client, private_redis):
    order, letter = dead_letter
    Order.objects.filter(pk=order.pk).update(expires_at=timezone.now() + timedelta(hours=1))
    private_redis.stop()
    client.force_login(staff("ops", "close_deadletter_order"))

    response = post_action(client, "close_now", letter)

    assert response.status_code == 200
    assert "Redis is unavailable: it was not requeued" in response.text
    letter.refresh_from_db()
    assert not letter.is_resolved


def test_a_dead_letter_that_cannot_be_written_goes_back_on_the_queue_a_last_delay_later(
        short_retries, failing_receiver, consumer, make_order, queue, clock, caplog):
    order = make_order(in_seconds=-1)
    failing_receiver.failing.add(order.pk)
    worker = consumer()
    worker.run(once=True)
    for delay in (1, 2):
        clock.advance(delay)
        worker.run(once=True)
    clock.advance(4)

    with broken_dead_letter_table(), caplog.at_level(logging.ERROR, logger="order_timeout"):
        worker.run(once=True)  # the last try fails, and so does writing its dead letter

    assert "Could not write 1 dead letter(s)" in caplog.text
    assert score_of(queue, str(order.pk)) == now_score(clock()) + 4000  # not a loop: 4 s on
    assert leased_members(queue) == [] and not DeadLetter.objects.exists()
    clock.advance(4)
    worker.run(once=True)
    assert DeadLetter.objects.get().order_id == str(order.pk)  # buried once the table is back
    assert pending_count(queue) == 0


@contextmanager
def broken_dead_letter_table():
    """Writing a dead letter fails with a real database error: its table is away for a while."""
    table = DeadLetter._meta.db_table
    rename_table(table, f"{table}_away")
    try:
        yield
    finally:
        rename_table(f"{table}_away", table)


# -- an order settled while its last try failed is not buried ------------------------------------


@pytest.mark.parametrize("settled_as", ["paid", "closed"])
def test_an_order_settled_before_its_dead_letter_is_written_gets_none(make_order, settled_as):
    """The consumer's last try failed; the payment committed before the letter was written."""
    from order_timeout.timers.giving_up import Failure, bury
    from order_timeout.timers.registry import ORDER_TIMEOUT

    order = make_order(in_seconds=-1)
    set_state(order, settled_as)

    burial = bury(ORDER_TIMEOUT, [Failure(order.pk, 4, now_score(timezone.now()), StockServiceDown("x"))],
                    timezone.now())

    assert not DeadLetter.objects.exists()
    assert (burial.buried, burial.settled, burial.missing) == ([], [order.pk], [])


def test_a_dead_letter_is_written_for_the_unpaid_orders_of_a_failure_only(make_order):
    from order_timeout.timers.giving_up import Failure, bury
    from order_timeout.timers.registry import ORDER_TIMEOUT

    unpaid, paid = make_order(in_seconds=-1), make_order(in_seconds=-1)
    set_state(paid, "paid")
    now = timezone.now()
    failures = [Failure(o.pk, 4, now_score(now), StockServiceDown("x")) for o in (unpaid, paid)]

    burial = bury(ORDER_TIMEOUT, [*failures, Failure(10**9, 4, now_score(now), StockServiceDown("x"))], now)

    assert list(DeadLetter.objects.values_list("order_id", flat=True)) == [str(unpaid.pk)]
    assert (burial.buried, burial.settled, burial.missing) == ([unpaid.pk], [paid.pk], [10**9])


def test_the_scan_buries_no_order_paid_since_it_read_the_row(make_order, queue, settings):
    """A scan whose earlier runs died with this order buries it, unless it was paid meanwhile."""
    from order_timeout.scans.compensation import CompensationScan

    order = make_order(in_seconds=-600)
    member = str(order.pk)
    queue.client.hset(queue.global_keys.scanning, member, settings.ORDER_TIMEOUT.get("MAX_TAKEOVERS", 3) + 1)
    scan = CompensationScan(now=timezone.now())
    set_state(order, "paid")  # between the scan's read of the overdue rows and its burial

    from order_timeout.timers.registry import ORDER_TIMEOUT

    scan._bury(ORDER_TIMEOUT, order.pk, 4, scan.result)

    assert not DeadLetter.objects.exists() and scan.result.dead_lettered == 0
