"""The compensation scan and the rebuild: what heals the losses Redis can suffer."""

from __future__ import annotations

import io
import logging
import os
import subprocess
import sys
import threading
from datetime import timedelta

import pytest
from django.core.management import call_command

from order_timeout.models import DeadLetter, Order
from order_timeout.scans.compensation import compensate
from order_timeout.signals import order_expired
from order_timeout.timers.members import deadline_score, now_score
from order_timeout.timers.watchdog import EXIT_STUCK
from testproject.shop.models import Expiry

from .conftest import PROJECT_ROOT, both_redis, database_url
from .helpers import expiries, keys_for, lose_redis_data, pending_count, score_of

pytestmark = pytest.mark.django_db(transaction=True)


@both_redis
def test_pitfall_1_redis_data_loss_is_healed_by_rebuild_and_the_scan(make_order, queue, redis_client,
                                                                     settings):
    settings.ORDER_TIMEOUT = {**settings.ORDER_TIMEOUT, "COMPENSATION_CHUNK": 2}
    future = [make_order(in_seconds=600 + i) for i in range(5)]
    overdue = [make_order(in_seconds=-600) for _ in range(3)]
    paid = make_order(in_seconds=600)
    paid.mark_paid()
    lose_redis_data(queue)  # Redis restarted without persistence

    out = io.StringIO()
    call_command("order_timeout_compensate", "--rebuild", stdout=out)

    assert {score_of(queue, str(o.pk)) for o in future} == {deadline_score(o.expires_at) for o in future}
    assert score_of(queue, str(paid.pk)) is None
    assert "5 unpaid orders with a future deadline examined, 5 put back into Redis" in out.getvalue()

    call_command("order_timeout_compensate", stdout=out)

    assert all(Order.objects.get(pk=o.pk).status == "closed" for o in overdue)
    assert all(Order.objects.get(pk=o.pk).status == "unpaid" for o in future)
    assert Expiry.objects.count() == 3
    assert "3 closed" in out.getvalue()


def test_pitfall_6_order_whose_zadd_failed_is_closed_by_the_scan_after_its_grace(
        private_redis, clock, caplog):
    private_redis.stop()
    with caplog.at_level(logging.WARNING, logger="order_timeout"):
        order = Order.objects.create(expires_at=clock() - timedelta(seconds=30))
    assert "compensation scan" in caplog.text
    private_redis.start()  # back, and empty: the member never made it

    within_grace = compensate(now=clock())
    assert within_grace.closed == 0
    assert Order.objects.get(pk=order.pk).status == "unpaid"

    after_grace = compensate(now=clock() + timedelta(seconds=121))  # COMPENSATION_GRACE: 150 s

    assert after_grace.closed == 1
    order.refresh_from_db()
    assert (order.status, order.close_reason) == ("closed", "timeout")
    assert Expiry.objects.filter(order_id=str(order.pk)).count() == 1


@both_redis
def test_scan_walks_overdue_orders_in_chunks_and_leaves_the_rest(make_order, queue):
    overdue = [make_order(in_seconds=-200 - i) for i in range(10)]
    recent = make_order(in_seconds=-10)  # within the grace: the consumer's job
    future = make_order(in_seconds=60)

    result = compensate(chunk_size=3)

    assert (result.examined, result.closed) == (10, 10)
    assert all(Order.objects.get(pk=o.pk).status == "closed" for o in overdue)
    assert Order.objects.get(pk=recent.pk).status == "unpaid"
    assert Order.objects.get(pk=future.pk).status == "unpaid"
    # Closed orders are dropped from Redis at once; the others stay scheduled.
    assert pending_count(queue) == 2


def test_scan_never_closes_a_paid_order(make_order):
    order = make_order(in_seconds=-600)
    order.mark_paid()

    result = compensate()

    assert result.closed == 0
    assert Order.objects.get(pk=order.pk).status == "paid"


def test_dry_run_changes_nothing(make_order, queue, redis_client):
    overdue = make_order(in_seconds=-600)
    make_order(in_seconds=600)
    redis_client.flushdb()

    scan = compensate(dry_run=True)
    rebuild = compensate(rebuild=True, dry_run=True)

    assert (scan.examined, scan.closed) == (1, 0)
    assert rebuild.restored == 1
    assert Order.objects.get(pk=overdue.pk).status == "unpaid"
    assert pending_count(queue) == 0


def test_rebuild_leaves_members_already_in_redis_alone(make_order, queue, clock):
    waiting = make_order(in_seconds=60)
    in_flight = make_order(in_seconds=120)
    retry_at = deadline_score(clock() + timedelta(seconds=30))
    queue.schedule({str(waiting.pk): retry_at})
    queue.client.zrem(keys_for(queue, str(in_flight.pk)).pending, str(in_flight.pk))
    queue.client.zadd(keys_for(queue, str(in_flight.pk)).leased, {str(in_flight.pk): retry_at})

    result = compensate(rebuild=True)

    assert (result.examined, result.restored) == (2, 0)
    assert score_of(queue, str(waiting.pk)) == retry_at
    assert score_of(queue, str(in_flight.pk)) is None  # still leased, not pending twice


def test_rebuild_skips_overdue_orders_which_are_the_scans(make_order, queue, redis_client):
    make_order(in_seconds=-600)
    redis_client.flushdb()

    result = compensate(rebuild=True)

    assert (result.examined, result.restored) == (0, 0)
    assert pending_count(queue) == 0


def test_scan_pages_through_orders_sharing_one_deadline(make_order, clock):
    deadline = clock() - timedelta(minutes=10)
    for _ in range(7):
        Order.objects.create(expires_at=deadline)

    result = compensate(dry_run=True, chunk_size=2)

    assert result.examined == 7


def test_scan_leaves_an_order_open_in_the_dead_letters_to_staff(make_order, clock, queue):
    order = make_order(in_seconds=-600)
    queue.unschedule([str(order.pk)])  # a dead letter leaves Redis
    letter = DeadLetter.objects.create(
        order_model="order_timeout.Order", order_id=str(order.pk), attempts=4,
        error_type="RuntimeError", first_failed_at=clock(), last_failed_at=clock())

    result = compensate()

    assert (result.closed, result.left_as_dead_letters) == (0, 1)
    assert Order.objects.get(pk=order.pk).status == "unpaid" and expiries(order) == 0
    letter.refresh_from_db()
    assert not letter.is_resolved


def test_scan_whose_lock_expires_during_a_chunk_stops_and_says_so(make_order, settings):
    settings.ORDER_TIMEOUT = {**settings.ORDER_TIMEOUT, "COMPENSATION_LOCK_SECONDS": 0.2}
    orders = [make_order(in_seconds=-600 - i) for i in range(3)]

    def slow(sender, order, **kwargs):
        threading.Event().wait(0.3)

    order_expired.connect(slow, weak=False)
    try:
        result = compensate(chunk_size=1)
    finally:
        order_expired.disconnect(slow)

    assert result.lock_lost and result.examined == 1 and result.closed == 1
    assert [Order.objects.get(pk=o.pk).status for o in orders].count("closed") == 1


@pytest.mark.parametrize("heal", [False, True], ids=["close", "heal"])
def test_scan_goes_on_without_its_lock_when_redis_goes_away_mid_scan(private_redis, make_order, heal):
    """The beat task runs in heal mode: it must go on closing too, as the docs say."""
    orders = [make_order(in_seconds=-600 - i) for i in range(3)]

    def redis_dies(sender, order, **kwargs):
        private_redis.stop()

    order_expired.connect(redis_dies, weak=False)
    try:
        result = compensate(chunk_size=1, heal=heal)
    finally:
        order_expired.disconnect(redis_dies)

    assert result.closed == 3 and result.locked is False
    assert all(Order.objects.get(pk=o.pk).status == "closed" for o in orders)


def test_two_scans_started_together_one_runs_one_skips(make_order, held_receiver):
    for _ in range(3):
        make_order(in_seconds=-600)

    results = {}
    first = threading.Thread(target=lambda: results.setdefault("first", compensate()))
    first.start()
    assert held_receiver.inside.wait(10)
    results["second"] = compensate()
    held_receiver.release.set()
    first.join(10)

    assert results["second"].skipped and results["second"].closed == 0
    assert not results["first"].skipped and results["first"].closed == 3
    # The lock is released: the next scan runs.
    assert not compensate().skipped


def test_scan_runs_without_its_lock_when_redis_is_down(private_redis, make_order, caplog):
    order = make_order(in_seconds=-600)
    private_redis.stop()

    with caplog.at_level(logging.WARNING, logger="order_timeout"):
        result = compensate()

    assert result.closed == 1 and result.locked is False
    assert Order.objects.get(pk=order.pk).status == "closed"
    assert "without its lock" in caplog.text


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_command_draws_a_progress_bar_on_a_terminal_and_ends_with_a_summary(make_order):
    for _ in range(4):
        make_order(in_seconds=-600)
    terminal, pipe = Terminal(), io.StringIO()

    call_command("order_timeout_compensate", "--dry-run", stdout=terminal)
    call_command("order_timeout_compensate", "--dry-run", stdout=pipe)

    assert "[" + "#" * 30 + "] 4/4" in terminal.getvalue()
    assert "#" not in pipe.getvalue()
    assert pipe.getvalue().strip().startswith("Scan (dry run): 4 overdue unpaid orders would be closed")


def test_scan_never_runs_the_receivers_of_an_order_in_retry_backoff(make_order, queue, clock, consumer,
                                                                   settings):
    """Overdue by far more than the grace, but Redis shows a consumer retrying it."""
    settings.ORDER_TIMEOUT = {**settings.ORDER_TIMEOUT, "RETRY_DELAYS": [60]}
    order = make_order(in_seconds=-600)
    calls = []

    def refuse(sender, order, **kwargs):
        calls.append(order.pk)
        raise RuntimeError("stock service down")

    order_expired.connect(refuse, weak=False)
    try:
        consumer().run(once=True)  # attempt 1 failed: back in pending, 60 s on
        result = compensate()
    finally:
        order_expired.disconnect(refuse)

    assert calls == [order.pk]  # the consumer's try only
    assert (result.examined, result.left_to_consumers, result.closed) == (1, 1, 0)


def test_scan_closes_an_order_whose_retry_no_consumer_took_within_the_grace(make_order, queue, clock):
    order = make_order(in_seconds=-600)
    member = str(order.pk)
    # Its retry came due 200 s ago, and no consumer took it.
    queue.client.zadd(keys_for(queue, member).pending, {member: now_score(clock()) - 200_000})
    queue.client.hset(keys_for(queue, member).attempts, member, 1)

    result = compensate()

    assert result.closed == 1 and Order.objects.get(pk=order.pk).status == "closed"


@pytest.mark.slow
@pytest.mark.parametrize("culprit, exit_code", [("SHOP_EXIT_ON_ORDER", 3), ("SHOP_HANG_ON_ORDER", EXIT_STUCK)],
                         ids=["exits", "hangs"])
def test_a_receiver_that_kills_or_hangs_the_scan_is_dead_lettered_and_the_rest_is_closed(
        make_order, queue, culprit, exit_code):
    """A receiver that hangs in the command's scan: the database ends the chunk's
    transaction after LEASE_SECONDS and the command exits (EXIT_STUCK), releasing
    its lock, like a scan that died."""
    orders = [make_order(in_seconds=-600 - i) for i in range(6)]
    killer = orders[2]
    queue.unschedule([str(o.pk) for o in orders])  # Redis lost them: the scan's to close
    env = {**os.environ, "DATABASE_URL": database_url(), culprit: str(killer.pk),
           "ORDER_TIMEOUT_LEASE_SECONDS": "2"}

    codes, closed_after = [], []
    for _ in range(7):
        scan = subprocess.run([sys.executable, "manage.py", "order_timeout_compensate"],
                              cwd=PROJECT_ROOT, env=env, capture_output=True, text=True, timeout=120)
        codes.append(scan.returncode)
        closed_after.append(Order.objects.filter(pk__in=[o.pk for o in orders], status="closed").count())
        if scan.returncode == 0:
            break
        if exit_code == 3:
            queue.client.delete(queue.global_keys.compensation_lock)  # the dead scan's lock runs out
        else:
            assert not queue.client.exists(queue.global_keys.compensation_lock)  # let go on the way out

    assert codes == [exit_code] * 4 + [0], codes  # the first scan, then one per allowed retry
    # The whole chunk rolled back; then one at a time, oldest first, up to the culprit; then
    # the rest before the culprit (fewest earlier scans first), which never stalls them again.
    assert closed_after == [0, 3, 5, 5, 5], closed_after
    assert [Order.objects.get(pk=o.pk).status for o in orders].count("closed") == 5
    letter = DeadLetter.objects.get()
    assert letter.order_id == str(killer.pk) and "compensation scans died" in letter.last_error
    assert queue.client.hlen(queue.global_keys.scanning) == 0


@pytest.mark.slow
def test_a_slow_but_healthy_chunk_is_not_taken_for_a_stuck_one(make_order, queue):
    """Each order's receivers take 0.3 s, the chunk of 12 far longer than LEASE_SECONDS (1 s):
    the scan sees progress after every order and finishes, closing all."""
    orders = [make_order(in_seconds=-600 - i) for i in range(12)]
    queue.unschedule([str(o.pk) for o in orders])  # Redis lost them: the scan's to close
    env = {**os.environ, "DATABASE_URL": database_url(), "SHOP_DELAY_SECONDS": "0.3",
           "ORDER_TIMEOUT_LEASE_SECONDS": "1"}

    scan = subprocess.run([sys.executable, "manage.py", "order_timeout_compensate"],
                          cwd=PROJECT_ROOT, env=env, capture_output=True, text=True, timeout=120)

    assert scan.returncode == 0, scan.stderr
    assert Order.objects.filter(pk__in=[o.pk for o in orders], status="closed").count() == 12


@both_redis
def test_the_beat_task_restores_members_a_failover_lost_and_closes_the_overdue(make_order, queue,
                                                                               redis_backend):
    """Writes lost with the old master: soon-due members come back, overdue ones are closed."""
    soon = [make_order(in_seconds=60 + i) for i in range(4)]
    far = make_order(in_seconds=86_400)  # a later scan restores it, before its deadline
    overdue = make_order(in_seconds=-600)
    lose_redis_data(queue)

    result = compensate(heal=True)

    assert result.mode == "heal" and (result.restored, result.closed) == (4, 1)
    assert {score_of(queue, str(o.pk)) for o in soon} == {deadline_score(o.expires_at) for o in soon}
    assert score_of(queue, str(far.pk)) is None
    assert Order.objects.get(pk=overdue.pk).status == "closed"
