"""Celery as a delay queue: one ``apply_async(eta=deadline)`` task per order, Redis broker."""

from __future__ import annotations

import os

from celery import Celery
from celery.signals import worker_process_shutdown

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "testproject.settings")

app = Celery("bench")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.conf.task_default_queue = "bench_eta"
# ETA tasks sit in the worker's memory until due; with Redis the broker
# redelivers unacked ones after the visibility timeout, so keep it long.
app.conf.broker_transport_options = {"visibility_timeout": 3600}


@worker_process_shutdown.connect
def write_commit_records(**kwargs: object) -> None:
    # Pool children leave without running atexit handlers.
    from .recorder import flush

    flush()


@app.task(name="bench.close_order", ignore_result=True)
def close_order(pk: int) -> None:
    from .closers import close_one

    not_yet = close_one(pk)
    if not_yet is not None:
        # The ETA timer fired before the row's deadline: come back at it.
        close_order.apply_async(args=[pk], eta=not_yet)
