"""Celery entry points: thin wrappers over the compensation scan."""

from __future__ import annotations

import logging
from typing import Any

from celery import shared_task
from django.db import router

from .conf import settings
from .db.schema import named, unapplied_migrations
from .models import DeadLetter
from .scans.compensation import compensate as run_compensation
from .scans.turns import run_prune, run_scan


@shared_task(name="order_timeout.tasks.compensate")
def compensate(rebuild: bool | None = None) -> dict[str, Any]:
    """Heal what Redis lost, then prune what the app no longer needs; returns counts.

    By default (the beat entry), when it is the fleet's turn (scans/turns.py: the consumers run
    the same jobs, and whoever's turn comes first runs each, once per interval): put back the
    members missing from Redis that fall due before the next scan, then close what is overdue
    and dropped, then, once per ``PRUNE_INTERVAL``, delete the rows past their retention
    (``prune`` in the result, None when it was not its turn). ``not_due``: a consumer ran the
    scan less than ``COMPENSATION_INTERVAL`` ago (or runs it now), so this beat did nothing. The
    prune runs after the scan, so it never delays a close, and stops after half of
    ``COMPENSATION_INTERVAL`` (the next turn goes on with it).
    ``rebuild=True``: put back every missing future deadline only.
    ``rebuild=False``: close what is overdue only.

    Runs inside ``ORDER_TIMEOUT['TASK_CONTEXT']`` (the shop's writer rules), on the shop's own
    task class (a shared task: it takes the ``task_cls`` of whichever app runs it).
    """
    with settings.task_context():
        # A worker started before ``manage.py migrate`` (a rolling upgrade): one line, no run.
        if missing := unapplied_migrations(router.db_for_write(DeadLetter)):
            logging.getLogger("order_timeout").warning(
                "Compensation scan skipped: migrations not applied yet: %s. Run manage.py migrate.", named(missing))
            return {"skipped": True, "unapplied_migrations": missing, "prune": None}
        if rebuild is not None:
            return {**run_compensation(rebuild=rebuild).as_dict(), "prune": None}
        scanned = run_scan("beat")
        scan = {"not_due": True} if scanned is None else {**scanned.as_dict(), "not_due": False}
        pruned = run_prune("beat", budget=settings.COMPENSATION_INTERVAL / 2)
        return {**scan, "prune": None if pruned is None else pruned.as_dict()}
