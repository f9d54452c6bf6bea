"""Celery entry points: thin wrappers over the compensation scan."""

from __future__ import annotations

from typing import Any

from celery import shared_task

from .conf import settings
from .scans.compensation import compensate as run_compensation


@shared_task(name="order_timeout.tasks.compensate")
def compensate(rebuild: bool | None = None) -> dict[str, Any]:
    """Heal what Redis lost; returns counts.

    By default (the beat entry): put back the members missing from Redis that
    fall due before the next scan, then close what is overdue and dropped.
    ``rebuild=True``: put back every missing future deadline only.
    ``rebuild=False``: close what is overdue only.

    Runs inside ``ORDER_TIMEOUT['TASK_CONTEXT']`` (the shop's writer rules), on the shop's own
    task class (a shared task: it takes the ``task_cls`` of whichever app runs it).
    """
    with settings.task_context():
        if rebuild is None:
            return run_compensation(heal=True).as_dict()
        return run_compensation(rebuild=rebuild).as_dict()
