"""Today's processes started on a database not yet migrated (before ``manage.py migrate`` in a
rolling upgrade, docs/upgrading.md): the database as the previous release left it. A consumer
says which migration is missing in one line, waits, and closes once they are applied; the
compensation task skips its run with one line until then."""

from __future__ import annotations

import logging
import time
from datetime import timedelta

import pytest
from django.db.migrations.loader import MigrationLoader
from django.utils import timezone

from order_timeout.consumer import Consumer
from order_timeout.db.schema import unapplied_migrations
from order_timeout.models import Order
from order_timeout.scheduling import order_kinds

from .conftest import running, wait_for
from .helpers import state
from .migrating import APP, app_migrated_to, migrate
from .releases import previous_release

pytestmark = pytest.mark.django_db(transaction=True)

# How long the shop takes between starting the new consumers and running migrate, here.
DEPLOY_GAP = 2.0


@pytest.fixture
def before_migrate() -> str:
    """The app's last migration applied to a shop's database before the upgrade: the previous release's."""
    return previous_release().last_migration(APP)


def applied_by_the_upgrade(before_migrate: str) -> list[str]:
    """Today's migrations of the app after ``before_migrate``, in order."""
    return sorted(name for app, name in MigrationLoader(None).disk_migrations if app == APP and name > before_migrate)


def waiting_lines(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [record for record in caplog.records if "not applied" in record.getMessage()]


def test_unapplied_migrations_are_those_migrate_would_apply(transactional_db, before_migrate):
    assert unapplied_migrations() == []
    with app_migrated_to(before_migrate):
        missing = unapplied_migrations()
    assert missing == applied_by_the_upgrade(before_migrate) != []


def test_a_consumer_started_before_migrate_waits_and_then_closes(transactional_db, before_migrate, caplog):
    with app_migrated_to(before_migrate), caplog.at_level(logging.INFO, logger="order_timeout"):
        order = Order.objects.create(expires_at=timezone.now() - timedelta(seconds=1))
        worker = Consumer(kinds=order_kinds(), max_wait=0.2)
        with running(worker):
            wait_for(lambda: waiting_lines(caplog) or "batch failed" in caplog.text)
            time.sleep(DEPLOY_GAP)  # the new consumers run a while before the shop migrates
            assert state(order) == "unpaid"
            migrate()
            wait_for(lambda: state(order) == "closed")

    (waiting,) = waiting_lines(caplog)
    assert waiting.levelno == logging.WARNING
    assert f"{APP}.{applied_by_the_upgrade(before_migrate)[0]}" in waiting.getMessage()
    assert "manage.py migrate" in waiting.getMessage()
    assert not [record for record in caplog.records if record.exc_info], caplog.text
    assert "batch failed" not in caplog.text
    assert worker.stats.closed == 1


def test_a_consumer_waiting_for_migrate_stops_when_asked(transactional_db, before_migrate, caplog):
    with app_migrated_to(before_migrate), caplog.at_level(logging.INFO, logger="order_timeout"):
        worker = Consumer(kinds=order_kinds())
        with running(worker) as thread:
            wait_for(lambda: waiting_lines(caplog) or "batch failed" in caplog.text)
        assert not thread.is_alive()
    assert worker.stats.batches == 0


def test_the_compensation_task_before_migrate_skips_its_run_with_one_line(transactional_db, before_migrate, caplog):
    from order_timeout.tasks import compensate

    with app_migrated_to(before_migrate), caplog.at_level(logging.INFO, logger="order_timeout"):
        order = Order.objects.create(expires_at=timezone.now() - timedelta(hours=1))
        skipped = compensate()
        migrate()
        ran = compensate()

    assert skipped["skipped"] and skipped["unapplied_migrations"] == applied_by_the_upgrade(before_migrate)
    assert [record.levelno for record in waiting_lines(caplog)] == [logging.WARNING]
    assert not ran["skipped"]
    assert state(order) == "closed"
