"""What the app keeps, and what the prune took away, shown where operators look: the status
command, the metrics and the admin's "Order timeouts" page."""

from __future__ import annotations

import io
import json

import pytest
from django.core.management import call_command
from django.db import connection

from order_timeout.models import Reminder
from order_timeout.scans.pruning import prune

from .test_metrics import monitor  # noqa: F401 (a fixture)
from .test_prune import DAY, reminder, retention  # noqa: F401 (a fixture)

pytestmark = pytest.mark.django_db(transaction=True)

METRICS_URL = "/metrics/order-timeout"


def analysed(*tables: str) -> None:
    """The database's statistics brought up to date: the sizes shown are its estimates."""
    with connection.cursor() as cursor:
        for table in tables:
            cursor.execute(f"ANALYZE {'' if connection.vendor == 'postgresql' else 'TABLE '}{table}")


def status() -> dict:
    out = io.StringIO()
    call_command("order_timeout_status", "--json", "--no-drift", stdout=out)
    return json.loads(out.getvalue())


def test_the_status_command_shows_each_app_tables_size_and_retention(retention):  # noqa: F811
    for n in range(5):
        reminder(-600, order_id=n)
    analysed(Reminder._meta.db_table)

    storage = status()["storage"]
    text = io.StringIO()
    call_command("order_timeout_status", "--no-drift", stdout=text)

    assert set(storage["tables"]) == {"notices", "reminders", "dead_letters", "refused_writes", "pauses", "deadlines",
                                      "queue_epochs"}
    reminders = storage["tables"]["reminders"]
    assert (reminders["table"], reminders["rows"], reminders["retention_seconds"]) == (
        "order_timeout_reminder", 5, DAY)
    assert reminders["bytes"] > 0
    assert storage["last_prune_at"] is None
    assert "storage (the database's estimates)" in text.getvalue()
    assert "reminders" in text.getvalue() and "kept 1 days once done" in text.getvalue()


def test_the_status_command_says_what_the_last_prune_deleted(retention):  # noqa: F811
    for n in range(3):
        reminder(2 * DAY, order_id=n)
    prune()

    storage = status()["storage"]
    text = io.StringIO()
    call_command("order_timeout_status", "--no-drift", stdout=text)

    assert storage["tables"]["reminders"]["deleted_last"] == 3
    assert storage["tables"]["reminders"]["deleted_total"] == 3
    assert storage["last_prune_at"] is not None
    assert "deleted 0 notices, 3 reminders, 0 dead letters" in text.getvalue()


def test_the_metrics_count_what_the_prune_deleted_and_each_tables_size(monitor, retention):  # noqa: F811
    for n in range(2):
        reminder(2 * DAY, order_id=n)
    prune()
    reminder(-600)
    analysed(Reminder._meta.db_table)

    text = monitor.get(METRICS_URL).content.decode()

    assert 'order_timeout_pruned_rows_total{table="reminders"} 2.0' in text
    assert 'order_timeout_table_rows{table="reminders"} 1.0' in text
    assert any(line.startswith('order_timeout_table_bytes{table="reminders"}') for line in text.splitlines())
    assert "order_timeout_last_prune_timestamp_seconds " in text


def test_the_admin_page_shows_each_tables_size_and_the_last_prune(admin_client, retention):  # noqa: F811
    reminder(2 * DAY)
    prune()

    page = admin_client.get("/admin/order_timeout/timeoutoverview/").content.decode()

    assert "Storage" in page
    assert "order_timeout_reminder" in page
    assert "Last prune" in page
