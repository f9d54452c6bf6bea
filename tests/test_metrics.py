"""Prometheus metrics: a consumer counts what it does; the backlog is read at scrape time."""

from __future__ import annotations

import urllib.request

import pytest
from django.contrib.auth.models import Permission, User
from django.core.exceptions import ImproperlyConfigured
from django.core.management import CommandError, call_command
from prometheus_client import CollectorRegistry

from order_timeout.conf import settings as order_settings
from order_timeout.consumer import Consumer
from order_timeout.models import DeadLetter
from order_timeout.reporting.metrics import ConsumerMetrics
from order_timeout.signals import order_expired

from .conftest import free_port, wait_for

pytestmark = pytest.mark.django_db(transaction=True)


def test_a_consumer_counts_its_closes_by_outcome_and_their_lateness(make_order, settings):
    settings.ORDER_TIMEOUT = {**settings.ORDER_TIMEOUT, "RETRY_DELAYS": []}
    orders = [make_order(in_seconds=-2) for _ in range(4)]
    paid = make_order(in_seconds=-2)
    paid.mark_paid()  # its ZREM lost: the consumer finds the row paid
    from order_timeout.queue import TimeoutQueue
    from order_timeout.timers.members import deadline_score

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


METRICS_URL = "/metrics/order-timeout"
TOKEN = "a-scraper-token-of-32-characters"


@pytest.fixture
def monitor(client):
    """A client logged in as a user with the permission to see the order timeouts."""
    user = User.objects.create_user("monitor", password="pw")
    user.user_permissions.add(Permission.objects.get(codename="view_timeoutoverview"))
    client.force_login(user)
    return client


@pytest.fixture
def token_configured(settings):
    settings.ORDER_TIMEOUT = {**settings.ORDER_TIMEOUT, "METRICS_TOKEN": TOKEN}


def test_the_django_view_exposes_the_backlog_gauges(monitor, make_order, clock):
    for seconds in (-30, -20, 600):
        make_order(in_seconds=seconds)
    DeadLetter.objects.create(order_model="order_timeout.Order", order_id="1", attempts=4,
                              error_type="RuntimeError", first_failed_at=clock(), last_failed_at=clock())

    response = monitor.get(METRICS_URL)

    text = response.content.decode()
    assert response.status_code == 200 and response["Content-Type"].startswith("text/plain")
    assert 'order_timeout_pending{shard="0"} 3.0' in text
    assert 'order_timeout_due{shard="0"} 2.0' in text
    assert "order_timeout_dead_letters 1.0" in text
    oldest = next(line for line in text.splitlines()
                  if line.startswith('order_timeout_oldest_due_age_seconds{shard="0"}'))
    assert float(oldest.split()[-1]) >= 29


def test_the_view_answers_inside_a_project_with_atomic_requests(monitor, make_order, monkeypatch):
    """ATOMIC_REQUESTS wraps the view in a transaction: the view must not close the connection
    under it (the scrape of a consumer's own port does, the request's is Django's to manage)."""
    from django.db import connection

    monkeypatch.setitem(connection.settings_dict, "ATOMIC_REQUESTS", True)
    make_order(in_seconds=-30)

    response = monitor.get(METRICS_URL)

    assert response.status_code == 200, response.content
    assert 'order_timeout_due{shard="0"} 1.0' in response.content.decode()


def test_the_view_reports_the_drift_the_last_beat_run_found(monitor, make_order, queue):
    from order_timeout.scans.compensation import compensate

    order = make_order(in_seconds=60)
    queue.unschedule([str(order.pk)])
    compensate(heal=True)

    assert "order_timeout_drift 1.0" in monitor.get(METRICS_URL).content.decode()


def test_the_view_is_not_public(client):
    response = client.get(METRICS_URL)

    assert response.status_code == 403
    assert "order_timeout_pending" not in response.content.decode()


def test_a_logged_in_user_without_the_permission_is_refused(client):
    client.force_login(User.objects.create_user("staffer", password="pw", is_staff=True))

    assert client.get(METRICS_URL).status_code == 403


def test_a_scraper_with_the_configured_bearer_token_reads_the_gauges(client, token_configured):
    response = client.get(METRICS_URL, headers={"Authorization": f"Bearer {TOKEN}"})

    assert response.status_code == 200
    assert 'order_timeout_pending{shard="0"} 0.0' in response.content.decode()


@pytest.mark.parametrize("authorization", [
    f"Bearer {TOKEN}x", f"Bearer {TOKEN[:-1]}", "Bearer ", "Bearer", f"Basic {TOKEN}", TOKEN,
    f"Bearer {TOKEN} {TOKEN}",
])
def test_a_wrong_or_malformed_token_is_refused(client, token_configured, authorization):
    assert client.get(METRICS_URL, headers={"Authorization": authorization}).status_code == 403


def test_no_token_opens_the_view_while_none_is_configured(client, settings):
    assert order_settings.METRICS_TOKEN is None

    for token in (TOKEN, "None", ""):
        response = client.get(METRICS_URL, headers={"Authorization": f"Bearer {token}"})
        assert response.status_code == 403


@pytest.mark.parametrize("value", [
    "", "short", "has a space in it, 16+", "a-newline-at-the-end-of-it\n", 32,
    b"bytes-token-of-32-characters-long", "non-ascii-token-\u00e9-of-enough-length",
])
def test_a_bad_metrics_token_is_improperly_configured_without_repeating_it(settings, value):
    settings.ORDER_TIMEOUT = {**settings.ORDER_TIMEOUT, "METRICS_TOKEN": value}

    with pytest.raises(ImproperlyConfigured, match=r"\['METRICS_TOKEN'\] must be None or") as raised:
        order_settings.load()
    if isinstance(value, str) and value:
        assert value.strip() not in str(raised.value)  # a secret is not written to a log


@pytest.mark.parametrize("value", ["-1", "70000", "http"])
def test_a_bad_metrics_port_is_a_command_error(value):
    with pytest.raises(CommandError, match="--metrics-port"):
        call_command("run_timeout_consumer", "--once", "--metrics-port", value)


def test_a_consumer_that_serves_no_metrics_counts_none(make_order):
    """Only run_timeout_consumer --metrics-port pays for the per-close histogram."""
    make_order(in_seconds=-1)
    worker = Consumer()

    worker.run(once=True)

    assert worker.stats.closed == 1 and worker.metrics.enabled is False
