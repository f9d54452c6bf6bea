"""Django's tasks framework with django-tasks-db's database backend, as a delay queue.

One task per order, enqueued with ``run_after=deadline``: ``django.tasks`` where Django has it
(6.0+), else the django-tasks backport. The backend keeps each task as a row; its ``db_worker``
claims one due row at a time (``SELECT ... FOR UPDATE SKIP LOCKED``) and, when none is due, sleeps
``--interval`` seconds (1 by default). Its models need INSTALLED_APPS: testproject/settings.py adds
them when BENCH_PEER_APPS names django_tasks_db, which scripts/bench sets for the harness (its
``migrate`` creates the table) and so for every closer.
"""

from __future__ import annotations

import importlib
import sys
import uuid
from collections.abc import Callable, Sequence
from importlib.util import find_spec
from typing import Any

from django.db import connection, transaction

from order_timeout.models import Order

from ..closers import close_one
from ..systems import CHUNK, FAKE_PK, System, _in_an_hour
from . import PEER_LIMITS

APP = "django_tasks_db"


def _task() -> Callable[[Callable[..., None]], Any]:
    """``task()`` of django.tasks (Django 6.0+), else of the backport; without either, none at all
    (the function stays a function, and the rows refuse to start)."""
    for module in ("django.tasks", "django_tasks"):
        if find_spec(module) is not None:
            return importlib.import_module(module).task()
    return lambda function: function


# The worker finds the task by its module path: this module's ``close_order`` must be the Task.
@_task()
def close_order(pk: int) -> None:
    """Close the order; when the task ran before the row's deadline, enqueue it again at that deadline."""
    not_yet = close_one(pk)
    if not_yet is not None:
        close_order.using(run_after=not_yet).enqueue(pk)


def _results() -> Any:
    from django.apps import apps

    if not apps.is_installed(APP):
        raise RuntimeError(f"The django_tasks rows need {APP} installed in the harness, before Django's "
                           f"setup: set BENCH_PEER_APPS={APP} (scripts/bench does, where it is installed).")
    from django_tasks_db.models import DBTaskResult

    return DBTaskResult


class DjangoTasks(System):
    """Django's tasks at their documented defaults: django-tasks-db's ``db_worker`` polls every 1 s.

    One task per order, ``close_order.using(run_after=deadline).enqueue(pk)``, each an INSERT
    (the framework has no bulk enqueue; a chunk of them shares a transaction); the task runs the
    shared close (``bench.closers.close_one``) and enqueues itself again when it ran early. Two
    workers, one task at a time each (the worker has no concurrency); finished rows stay.
    """

    name = "django_tasks"
    label = "Django tasks (django-tasks-db): enqueue(run_after=deadline), db_worker polls every 1 s (its default)"
    closers = "2 db_workers (one task at a time each), 1 tx per order"
    interval: float | None = None  # db_worker --interval; None: its default, 1 s
    memory = "table"
    full_only = True
    limits = PEER_LIMITS
    extra_env = {"BENCH_PEER_APPS": APP}
    # An INSERT per order (and a Task copied by using()): 1 ms on PostgreSQL, 1.7 ms on MariaDB,
    # on a loaded 2-vCPU VM.
    enqueue_seconds = 0.0015
    crash_note = (
        "There is no lease: a worker killed mid-task leaves its row RUNNING, and nothing ever runs it "
        "again (django-tasks#46, open); the framework has neither retry nor cancel, so that order is "
        "never closed, while rows not yet claimed go to the other worker. A task that raised is "
        "FAILED, never retried. The broker is the database itself: tasks are rows, so losing it "
        "loses none, but db_worker re-raises any database error other than a lock wait and exits, so "
        "a supervisor must restart it, and a task whose result could not be saved stays RUNNING; an "
        "enqueue in on_commit that fails after the order's commit leaves that order with no task.")

    def commands(self) -> list[list[str]]:
        interval = [] if self.interval is None else ["--interval", str(self.interval)]
        # Quiet, as our consumers run (-v 0): at -v 1 it logs every task's start and end.
        return [[sys.executable, "manage.py", "db_worker", "--verbosity", "0", "--no-reload", *interval]
                for _ in range(self.processes)]

    def start(self) -> None:
        self._empty()
        super().start()

    def _empty(self) -> None:
        table = connection.ops.quote_name(_results()._meta.db_table)
        with connection.cursor() as cursor:
            cursor.execute(f"TRUNCATE TABLE {table}")

    def enqueue(self, orders: Sequence[Order]) -> None:
        _results()
        for start in range(0, len(orders), CHUNK):
            with transaction.atomic():
                for order in orders[start:start + CHUNK]:
                    close_order.using(run_after=order.expires_at).enqueue(order.pk)

    def enqueue_on_commit(self, order: Order) -> None:
        _results()
        pk, deadline = order.pk, order.expires_at
        transaction.on_commit(lambda: close_order.using(run_after=deadline).enqueue(pk))

    def hold_far_future(self, count: int) -> None:
        """The rows ``enqueue()`` writes, bulk-created: a million enqueues would take minutes."""
        model, deadline = _results(), _in_an_hour()
        for start in range(FAKE_PK, FAKE_PK + count, CHUNK):
            model.objects.bulk_create([
                model(id=uuid.uuid4(), args_kwargs={"args": [pk], "kwargs": {}}, task_path=close_order.module_path,
                      queue_name=close_order.queue_name, priority=close_order.priority,
                      backend_name=close_order.backend, run_after=deadline)
                for pk in range(start, min(start + CHUNK, FAKE_PK + count))])

    def forget_far_future(self) -> None:
        self._empty()


class DjangoTasksTuned(DjangoTasks):
    """Django's tasks with the knob that decides its latency tuned: ``db_worker --interval 0.1``."""

    name = "django_tasks_tuned"
    label = "Django tasks (django-tasks-db): enqueue(run_after=deadline), db_worker polls every 0.1 s (tuned)"
    interval = 0.1


SYSTEMS = (DjangoTasks, DjangoTasksTuned)
