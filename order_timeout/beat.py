"""The Celery beat entry of the compensation scan, for both kinds of beat configuration.

Plain Celery: ``app.conf.beat_schedule = {**beat_schedule(), ...}`` (or put
the same dict in ``CELERY_BEAT_SCHEDULE``). django-celery-beat: call
``install_periodic_task()`` once, e.g. from a data migration or a deploy step.
"""

from __future__ import annotations

from typing import Any

from django.core.exceptions import ImproperlyConfigured

from .conf import settings

TASK_NAME = "order_timeout.tasks.compensate"
ENTRY_NAME = "order-timeout-compensate"


def beat_schedule(interval: float | None = None) -> dict[str, dict[str, Any]]:
    """``{name: entry}`` running the scan every ``interval`` seconds.

    The default is ``COMPENSATION_INTERVAL``; pass the interval yourself when
    calling this from a settings module, where settings cannot be read yet.
    """
    every = float(settings.COMPENSATION_INTERVAL if interval is None else interval)
    return {ENTRY_NAME: {"task": TASK_NAME, "schedule": every}}


def install_periodic_task() -> Any:
    """Create or update django-celery-beat's PeriodicTask for the scan; returns it."""
    try:
        from django_celery_beat.models import IntervalSchedule, PeriodicTask
    except ImportError as exc:  # pragma: no cover - depends on the project
        raise ImproperlyConfigured(
            "install_periodic_task() needs django-celery-beat in INSTALLED_APPS."
        ) from exc

    every = round(settings.COMPENSATION_INTERVAL)
    interval, _ = IntervalSchedule.objects.get_or_create(every=every, period=IntervalSchedule.SECONDS)
    task, _ = PeriodicTask.objects.update_or_create(
        name=ENTRY_NAME, defaults={"task": TASK_NAME, "interval": interval, "enabled": True}
    )
    return task
