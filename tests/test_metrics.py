"""Prometheus metrics: a consumer counts what it does; the backlog is read at scrape time."""

from __future__ import annotations

import urllib.request

import pytest
from django.core.management import CommandError, call_command
from prometheus_client import CollectorRegistry

from order_timeout.consumer import Consumer
from order_timeout.metrics import ConsumerMetrics
from order_timeout.models import DeadLetter
from order_timeout.signals import order_expired

from .conftest import free_port, wait_for

pytestmark = pytest.mark.django_db(transaction=True)


def test_a_consumer_counts_its_closes_by_outcome_and_their_lateness(make_order, settings):
    settings.ORDER_TIMEOUT = {**settings.ORDER_TIMEOUT, "RETRY_DELAYS": []}
    orders = [make_order(in_seconds=-2) for _ in range(4)]
    paid = make_order(in_seconds=-2)
    paid.mark_paid()  # its ZREM lost: the consumer finds the row paid
    from order_timeout.codec import deadline_score
    from order_timeout.queue import TimeoutQueue

    TimeoutQueue.from_settings().schedule({str(paid.pk): deadline_score(paid.expires_at)})

    def refuse(sender, order, **kwargs):
        if order.pk == orders[0].pk:
            raise RuntimeError("stock service down")

    metrics = ConsumerMetrics(CollectorRegistry())
    order_expired.connect(refuse, weak=False)
    try:
        Consumer(metrics=metrics).run(once=True)
    finally:
        order_expired.disconnect(refuse)

    value = metrics.registry.get_sample_value
    assert value("order_timeout_closes_total", {"outcome": "closed"}) == 3
    assert value("order_timeout_closes_total", {"outcome": "settled"}) == 1
    assert value("order_timeout_closes_total", {"outcome": "failed"}) == 1
    assert value("order_timeout_closes_total", {"outcome": "dead_lettered"}) == 1
    assert value("order_timeout_dead_letters_written_total") == 1
    assert value("order_timeout_close_lateness_seconds_count") == 3
    # Due two seconds ago: every close lands in the buckets above 1 s, none below.
    assert value("order_timeout_close_lateness_seconds_bucket", {"le": "1.0"}) == 0
    assert value("order_timeout_close_lateness_seconds_bucket", {"le": "5.0"}) == 3
    assert value("order_timeout_batch_size_count") >= 1


@pytest.mark.slow
def test_the_consumer_serves_its_metrics_and_the_backlog_on_a_port(consumer_process, make_order):
    make_order(in_seconds=-1)
    make_order(in_seconds=600)
    port = free_port()
    worker = consumer_process("--metrics-port", str(port), "--metrics-address", "127.0.0.1")

    def scraped() -> str:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as response:
                return response.read().decode()
        except OSError:
            return ""

    wait_for(lambda: 'order_timeout_closes_total{outcome="closed"} 1.0' in scraped(), timeout=60)
    text = scraped()
    worker.kill()

    assert 'order_timeout_pending{shard="0"} 1.0' in text
    assert 'order_timeout_due{shard="0"} 0.0' in text
    assert "order_timeout_close_lateness_seconds_bucket" in text
    assert "order_timeout_dead_letters 0.0" in text


def test_the_django_view_exposes_the_backlog_gauges(client, make_order, clock):
    for seconds in (-30, -20, 600):
        make_order(in_seconds=seconds)
    DeadLetter.objects.create(order_model="order_timeout.Order", order_id="1", attempts=4,
                              error_type="RuntimeError", first_failed_at=clock(), last_failed_at=clock())

    response = client.get("/metrics/order-timeout")

    text = response.content.decode()
    assert response.status_code == 200 and response["Content-Type"].startswith("text/plain")
    assert 'order_timeout_pending{shard="0"} 3.0' in text
    assert 'order_timeout_due{shard="0"} 2.0' in text
    assert "order_timeout_dead_letters 1.0" in text
    oldest = next(line for line in text.splitlines()
                  if line.startswith('order_timeout_oldest_due_age_seconds{shard="0"}'))
    assert float(oldest.split()[-1]) >= 29


def test_the_view_reports_the_drift_the_last_beat_run_found(client, make_order, queue):
    from order_timeout.compensation import compensate

    order = make_order(in_seconds=60)
    queue.unschedule([str(order.pk)])
    compensate(heal=True)

    assert "order_timeout_drift 1.0" in client.get("/metrics/order-timeout").content.decode()


@pytest.mark.parametrize("value", ["-1", "70000", "http"])
def test_a_bad_metrics_port_is_a_command_error(value):
    with pytest.raises(CommandError, match="--metrics-port"):
        call_command("run_timeout_consumer", "--once", "--metrics-port", value)
