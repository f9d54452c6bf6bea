"""The compensation scan on Celery: the beat entry, and a real worker running it."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from datetime import timedelta
from pathlib import Path

import pytest
from django.conf import settings as django_settings
from django.utils import timezone

from order_timeout import unschedule
from order_timeout.beat import (
    ENTRY_NAME,
    TASK_NAME,
    beat_schedule,
    install_periodic_task,
)
from order_timeout.models import Order
from order_timeout.tasks import compensate
from testproject.celery import app as celery_app
from testproject.demo import stop

from .conftest import PROJECT_ROOT, database_url, wait_for


def test_beat_entry_runs_the_scan_every_five_minutes_by_default(settings):
    del settings.ORDER_TIMEOUT

    assert beat_schedule() == {ENTRY_NAME: {"task": TASK_NAME, "schedule": 300.0}}


def test_plain_celery_beat_schedule_reaches_the_celery_app_and_names_a_registered_task():
    celery_app.loader.import_default_modules()

    assert django_settings.CELERY_BEAT_SCHEDULE == {ENTRY_NAME: {"task": TASK_NAME, "schedule": 300.0}}
    assert celery_app.conf.beat_schedule == django_settings.CELERY_BEAT_SCHEDULE
    assert TASK_NAME in celery_app.tasks


@pytest.mark.django_db
def test_django_celery_beat_periodic_task_is_installed_once_and_follows_the_setting(settings):
    pytest.importorskip(
        "django_celery_beat",
        reason="django-celery-beat is not installed: it does not support this Django yet "
               "(the 'beat' dependency group is left out of that run)")
    from django_celery_beat.models import PeriodicTask

    install_periodic_task()
    settings.ORDER_TIMEOUT = {**settings.ORDER_TIMEOUT, "COMPENSATION_INTERVAL": 120}
    task = install_periodic_task()

    assert PeriodicTask.objects.filter(name=ENTRY_NAME).count() == 1
    assert (task.task, task.interval.every, task.interval.period) == (TASK_NAME, 120, "seconds")
    assert task.enabled


@pytest.fixture
def celery_worker(redis_client, tmp_path) -> Iterator[Callable[..., subprocess.Popen[str]]]:
    """Start ``celery -A testproject worker`` on the test database and the test Redis."""
    started: list[subprocess.Popen[str]] = []

    def start(*args: str, env: dict[str, str] | None = None) -> subprocess.Popen[str]:
        workdir = Path(tempfile.mkdtemp(dir=tmp_path))
        proc = subprocess.Popen(
            [sys.executable, "-m", "celery", "-A", "testproject", "worker", "--pool=solo",
             "--concurrency=1", "--loglevel=INFO", "--without-gossip", "--without-mingle",
             "--without-heartbeat", "-s", str(workdir / "beat-schedule"), *args],
            cwd=PROJECT_ROOT, text=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
            env={**os.environ, "DATABASE_URL": database_url(), **(env or {})},
        )
        started.append(proc)
        return proc

    yield start
    for proc in started:
        stop(proc)  # warm shutdown, then kill


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_scan_task_run_by_a_real_worker_closes_overdue_orders_and_returns_counts(
        celery_worker, make_order):
    overdue = [make_order(in_seconds=-600) for _ in range(3)]
    fresh = make_order(in_seconds=-1)
    celery_worker()

    result = compensate.delay().get(timeout=60)

    assert result["closed"] == 3 and result["mode"] == "heal" and not result["skipped"]
    assert all(Order.objects.get(pk=o.pk).status == "closed" for o in overdue)
    assert Order.objects.get(pk=fresh.pk).status == "unpaid"  # within the grace


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_beat_entry_fires_the_scan_on_a_real_worker(celery_worker, make_order):
    overdue = make_order(in_seconds=-5)
    worker = celery_worker("--beat", env={"ORDER_TIMEOUT_COMPENSATION_INTERVAL": "1",
                                          "ORDER_TIMEOUT_COMPENSATION_GRACE": "0"})

    wait_for(lambda: Order.objects.get(pk=overdue.pk).status == "closed", timeout=60)

    assert worker.poll() is None
    later = Order.objects.create(expires_at=timezone.now() - timedelta(seconds=1))
    unschedule([later])  # only the beat can close this one now
    wait_for(lambda: Order.objects.get(pk=later.pk).status == "closed", timeout=60)
