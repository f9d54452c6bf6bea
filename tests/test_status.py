"""``order_timeout_status``: the numbers, and exit codes that cron and health checks can use."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys

import pytest
from django.core.management import CommandError, call_command
from django.utils import timezone

from order_timeout.consumer import Consumer
from order_timeout.models import DeadLetter, Order
from order_timeout.timers.members import now_score

from .conftest import PROJECT_ROOT, both_models, both_redis, database_url, running, wait_for
from .helpers import claim_everywhere, claim_next, keys_for, score_of
from .holding import row_locked_elsewhere

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def backlog(make_order, clock):
    """2 due (1 claimed), 3 pending in the future, 1 open and 1 resolved dead letter."""
    for seconds in (-30, -20):
        make_order(in_seconds=seconds)
    for seconds in (60, 120, 180):
        make_order(in_seconds=seconds)
    claim_next(Consumer(now=clock, batch_size=1), clock())
    now = timezone.now()
    for resolved_at in (None, now):
        DeadLetter.objects.create(order_model="order_timeout.Order", order_id="1", attempts=4,
                                  error_type="RuntimeError", first_failed_at=now,
                                  last_failed_at=now, resolved_at=resolved_at)


def status(*args):
    out = io.StringIO()
    call_command("order_timeout_status", "--json", *args, stdout=out)
    return json.loads(out.getvalue())


@both_redis
def test_status_reports_the_backlog(backlog):
    numbers = status()

    assert numbers["pending"] == 4
    assert numbers["due_unclaimed"] == 1
    assert numbers["leased"] == 1
    assert 19 <= numbers["oldest_due_age_seconds"] < 60
    assert numbers["dead_letters"] == 1
    assert numbers["overdue_unpaid_in_database"] == 2


def test_status_prints_a_table_for_people(backlog):
    out = io.StringIO()
    call_command("order_timeout_status", stdout=out)

    assert "due unclaimed" in out.getvalue() and "dead letters" in out.getvalue()


def test_thresholds_not_crossed_exit_zero(backlog):
    status("--max-overdue", "2", "--max-age", "3600", "--max-dead-letters", "1")


@pytest.mark.parametrize("args, message", [
    (["--max-overdue", "1"], "2 overdue unpaid orders > --max-overdue 1"),
    (["--max-age", "5"], "oldest due member waited"),
    (["--max-dead-letters", "0"], "1 open dead letters > --max-dead-letters 0"),
])
def test_crossed_threshold_is_a_command_error_with_exit_status_2(backlog, args, message):
    with pytest.raises(CommandError, match=message) as raised:
        status(*args)

    assert raised.value.returncode == 2


@pytest.mark.slow
def test_manage_py_exits_2_when_a_threshold_is_crossed(backlog):
    result = subprocess.run(
        [sys.executable, "manage.py", "order_timeout_status", "--max-overdue", "0"],
        cwd=PROJECT_ROOT, capture_output=True, text=True, timeout=60,
        env={**os.environ, "DATABASE_URL": database_url()},
    )

    assert result.returncode == 2, result.stderr
    assert "overdue unpaid in database  2" in result.stdout


def test_status_fails_clearly_when_redis_is_down(private_redis):
    private_redis.stop()

    with pytest.raises(CommandError, match="Cannot read the queue") as raised:
        status()

    assert raised.value.returncode == 1


def test_bad_threshold_is_a_command_error():
    with pytest.raises(CommandError, match="--max-age"):
        call_command("order_timeout_status", "--max-age", "-3")


def test_status_counts_expired_leases_as_waiting(make_order, queue, clock):
    make_order(in_seconds=-30)
    # Claimed by a consumer that died: its lease ran out a second ago.
    claim_everywhere(queue, now_score(clock()), 1, now_score(clock()) - 1000, "a-consumer-that-died")

    numbers = status()

    assert numbers["leased"] == 1 and numbers["expired_leases"] == 1
    assert numbers["oldest_due_age_seconds"] >= 1  # since the lease ran out


@both_models
def test_status_counts_unpaid_orders_missing_from_redis_as_drift(make_order, queue, order_model):
    kept = make_order(in_seconds=600)
    lost = [make_order(in_seconds=600 + i) for i in range(3)]
    buried = make_order(in_seconds=-600)
    paid = make_order(in_seconds=600)
    paid.mark_paid()
    # Writes Redis lost (a failover, a bulk update nobody scheduled); the buried
    # order left Redis on purpose, as an open dead letter.
    queue.unschedule([str(o.pk) for o in [*lost, buried]])
    now = timezone.now()
    DeadLetter.objects.create(order_model=order_model._meta.label, order_id=str(buried.pk), attempts=4,
                              error_type="RuntimeError", first_failed_at=now, last_failed_at=now)

    numbers = status()

    assert numbers["drift"] == 3
    assert numbers["pending"] == 1 and score_of(queue, str(kept.pk)) is not None


def test_crossed_drift_threshold_exits_2_and_no_drift_skips_the_count(make_order, queue):
    order = make_order(in_seconds=600)
    queue.unschedule([str(order.pk)])

    with pytest.raises(CommandError, match="1 unpaid orders with a deadline are missing") as raised:
        status("--max-drift", "0")
    assert raised.value.returncode == 2
    assert status("--no-drift")["drift"] is None
    with pytest.raises(CommandError, match="--no-drift"):
        status("--no-drift", "--max-drift", "0")


@pytest.mark.parametrize("order_model", ["shop.ShopOrder"], indirect=True)
def test_status_counts_unpaid_orders_without_a_deadline(make_order, order_model):
    order = make_order(in_seconds=600)
    order_model.objects.filter(pk=order.pk).update(expires_at=None)

    assert status()["unpaid_without_deadline"] == 1


def test_status_shows_a_row_locked_elsewhere_for_long_and_can_alert_on_it(make_order, queue, clock,
                                                                         consumer):
    order = make_order(in_seconds=-1)

    with row_locked_elsewhere(Order, order.pk):
        worker = consumer()
        worker.run(once=True)
        for _ in range(3):  # every claim a second later finds it locked again
            clock.advance(1)
            worker.run(once=True)
        member = str(order.pk)  # as if the first of those claims was 90 s ago
        queue.client.zadd(keys_for(queue, member).busy, {member: now_score(timezone.now()) - 90_000}, xx=True)
        numbers = status()
        with pytest.raises(CommandError, match="locked elsewhere for 9") as raised:
            status("--max-busy-age", "60")

    assert numbers["busy"] == 1 and numbers["oldest_busy_age_seconds"] >= 90
    assert raised.value.returncode == 2


def test_status_counts_orders_taken_over_from_dead_consumers(make_order, queue, clock):
    make_order(in_seconds=-1)
    claim_everywhere(queue, now_score(clock()), 1, now_score(clock()) - 1, "a-consumer-that-died")
    claim_everywhere(queue, now_score(clock()), 1, now_score(clock()) + 30_000, "the-next-one")

    assert status()["taken_over"] == 1
    with pytest.raises(CommandError, match="1 orders taken over"):
        status("--max-taken-over", "0")


def test_orders_of_a_batch_given_up_wait_since_the_hand_over_in_status_and_gauge(
        make_order, queue, held_receiver, settings):
    """The guard hands a batch over at once (its leases run out now): the age counts from then,
    in the status command and in the metrics gauge alike."""
    settings.ORDER_TIMEOUT = {**settings.ORDER_TIMEOUT, "LEASE_SECONDS": 1}
    make_order(in_seconds=-1)

    worker = Consumer(max_wait=0.05)
    with running(worker):
        assert held_receiver.inside.wait(20)
        wait_for(lambda: queue.stats(now_score(timezone.now())).expired_leases == 1, timeout=20)
        numbers = status("--no-drift")
        gauge = backlog_gauge("order_timeout_oldest_due_age_seconds")
        held_receiver.release.set()

    assert numbers["expired_leases"] == 1
    assert 0 <= numbers["oldest_due_age_seconds"] < 60
    assert 0 < gauge < 60


def test_a_failed_close_of_an_order_found_locked_before_is_no_longer_busy(
        make_order, queue, clock, consumer, receiver):
    order = make_order(in_seconds=-1)
    worker = consumer()
    with row_locked_elsewhere(Order, order.pk):
        worker.run(once=True)
    assert status("--no-drift")["busy"] == 1

    @receiver
    def refuse(sender, order, **kwargs):
        raise RuntimeError("the stock service is down")

    clock.advance(1)
    stats = worker.run(once=True)

    assert stats.failed == 1
    assert status("--no-drift")["busy"] == 0
    assert backlog_gauge("order_timeout_busy") == 0


def test_a_row_locked_for_long_shows_in_the_oldest_busy_age_gauge(make_order, queue, clock, consumer):
    """What the OrderTimeoutRowLocked alert of docs/operations.md reads."""
    order = make_order(in_seconds=-1)
    with row_locked_elsewhere(Order, order.pk):
        worker = consumer()
        worker.run(once=True)
        member = str(order.pk)  # as if that claim was 150 s ago, and every claim since found it locked
        queue.client.zadd(keys_for(queue, member).busy, {member: now_score(timezone.now()) - 150_000},
                          xx=True)
        clock.advance(1)
        worker.run(once=True)
        age = backlog_gauge("order_timeout_oldest_busy_age_seconds")

    assert 150 <= age < 200


def backlog_gauge(name: str) -> float:
    """The value of a backlog gauge, summed over shards (max for ages), as Prometheus scrapes it."""
    from order_timeout.reporting.metrics import backlog_registry

    samples = [sample.value for family in backlog_registry().collect() if family.name == name
               for sample in family.samples]
    assert samples, f"no gauge {name}"
    return max(samples) if name.endswith("_seconds") else sum(samples)
