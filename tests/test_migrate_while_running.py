"""A consumer that meets a database not yet migrated (started before ``manage.py migrate`` in a
rolling upgrade) says which migration is missing in one line, waits, and closes once it is applied."""

from __future__ import annotations

import logging
import time
from datetime import timedelta

import pytest
from django.utils import timezone

from order_timeout.consumer import Consumer
from order_timeout.db.schema import unapplied_migrations
from order_timeout.models import Order
from order_timeout.scheduling import order_kinds

from .conftest import running, wait_for
from .helpers import state
from .migrating import app_migrated_to, migrate

pytestmark = pytest.mark.django_db(transaction=True)

# What a shop's database holds before the upgrade's migrate, in these tests: 0.3's first
# migrations applied, its last ones not (a table, a database default and indexes missing).
BEFORE_MIGRATE = "0006_notices"
MISSING = ["0007_queue_epoch", "0008_deadletter_timer_db_default", "0009_retention_indexes"]
# How long the shop takes between starting the new consumers and running migrate, here.
DEPLOY_GAP = 2.0


def test_unapplied_migrations_are_those_migrate_would_apply(transactional_db):
    assert unapplied_migrations() == []
    with app_migrated_to(BEFORE_MIGRATE):
        missing = unapplied_migrations()
    assert missing[:len(MISSING)] == MISSING  # and any a later release adds after them


def test_a_consumer_started_before_migrate_waits_and_then_closes(transactional_db, caplog):
    with app_migrated_to(BEFORE_MIGRATE), caplog.at_level(logging.INFO, logger="order_timeout"):
        order = Order.objects.create(expires_at=timezone.now() - timedelta(seconds=1))
        worker = Consumer(kinds=order_kinds(), max_wait=0.2)
        with running(worker):
            wait_for(lambda: "not applied" in caplog.text or "batch failed" in caplog.text)
            time.sleep(DEPLOY_GAP)  # the new consumers run a while before the shop migrates
            assert state(order) == "unpaid"
            migrate()
            wait_for(lambda: state(order) == "closed")

    waiting = [record for record in caplog.records if "not applied" in record.getMessage()]
    assert len(waiting) == 1, caplog.text
    assert waiting[0].levelno == logging.WARNING
    assert "order_timeout.0007_queue_epoch" in waiting[0].getMessage()
    assert "manage.py migrate" in waiting[0].getMessage()
    assert not [record for record in caplog.records if record.exc_info], caplog.text
    assert "batch failed" not in caplog.text
    assert worker.stats.closed == 1


def test_a_consumer_waiting_for_migrate_stops_when_asked(transactional_db, caplog):
    with app_migrated_to(BEFORE_MIGRATE), caplog.at_level(logging.INFO, logger="order_timeout"):
        worker = Consumer(kinds=order_kinds())
        with running(worker) as thread:
            wait_for(lambda: "not applied" in caplog.text or "batch failed" in caplog.text)
        assert not thread.is_alive()
    assert worker.stats.batches == 0
