"""The compensation scan and the rebuild: what heals the losses Redis can suffer."""

from __future__ import annotations

import io
import logging
import threading
from datetime import timedelta

import pytest
from django.core.management import call_command
from django.utils import timezone

from order_timeout.codec import deadline_score
from order_timeout.compensation import compensate
from order_timeout.models import Order
from order_timeout.signals import order_expired
from testproject.shop.models import Expiry

pytestmark = pytest.mark.django_db(transaction=True)


def test_pitfall_1_redis_data_loss_is_healed_by_rebuild_and_the_scan(make_order, queue, redis_client):
    future = [make_order(in_seconds=600 + i) for i in range(5)]
    overdue = [make_order(in_seconds=-120) for _ in range(3)]
    paid = make_order(in_seconds=600)
    paid.mark_paid()
    redis_client.flushdb()  # Redis restarted without persistence

    out = io.StringIO()
    call_command("order_timeout_compensate", "--rebuild", stdout=out)

    assert {queue.score_of(str(o.pk)) for o in future} == {deadline_score(o.expires_at) for o in future}
    assert queue.score_of(str(paid.pk)) is None
    assert "8 unpaid orders examined, 8 put back into Redis" in out.getvalue()

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

    after_grace = compensate(now=clock() + timedelta(seconds=31))

    assert after_grace.closed == 1
    order.refresh_from_db()
    assert (order.status, order.close_reason) == ("closed", "timeout")
    assert Expiry.objects.filter(order_id=str(order.pk)).count() == 1


def test_scan_walks_overdue_orders_in_chunks_and_leaves_the_rest(make_order, queue):
    overdue = [make_order(in_seconds=-100 - i) for i in range(10)]
    recent = make_order(in_seconds=-10)  # within the grace: the consumer's job
    future = make_order(in_seconds=60)

    result = compensate(chunk_size=3)

    assert (result.examined, result.closed) == (10, 10)
    assert all(Order.objects.get(pk=o.pk).status == "closed" for o in overdue)
    assert Order.objects.get(pk=recent.pk).status == "unpaid"
    assert Order.objects.get(pk=future.pk).status == "unpaid"
    # Closed orders are dropped from Redis at once; the others stay scheduled.
    assert queue.pending_count() == 2


def test_scan_never_closes_a_paid_order(make_order):
    order = make_order(in_seconds=-600)
    order.mark_paid()

    result = compensate()

    assert result.closed == 0
    assert Order.objects.get(pk=order.pk).status == "paid"


def test_dry_run_changes_nothing(make_order, queue, redis_client):
    overdue = make_order(in_seconds=-600)
    redis_client.flushdb()

    scan = compensate(dry_run=True)
    rebuild = compensate(rebuild=True, dry_run=True)

    assert (scan.examined, scan.closed) == (1, 0)
    assert rebuild.restored == 1
    assert Order.objects.get(pk=overdue.pk).status == "unpaid"
    assert queue.pending_count() == 0


def test_rebuild_leaves_a_pending_retry_at_its_backoff(make_order, queue, clock):
    order = make_order(in_seconds=-1)
    retry_at = deadline_score(clock() + timedelta(seconds=30))
    queue.schedule({str(order.pk): retry_at})

    result = compensate(rebuild=True)

    assert result.restored == 0
    assert queue.score_of(str(order.pk)) == retry_at


def test_two_scans_started_together_one_runs_one_skips(make_order):
    for _ in range(3):
        make_order(in_seconds=-600)
    inside, release = threading.Event(), threading.Event()

    def slow(sender, order, **kwargs):
        inside.set()
        release.wait(10)

    order_expired.connect(slow, weak=False)
    results = {}
    try:
        first = threading.Thread(target=lambda: results.setdefault("first", compensate()))
        first.start()
        assert inside.wait(10)
        results["second"] = compensate()
        release.set()
        first.join(10)
    finally:
        order_expired.disconnect(slow)

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
