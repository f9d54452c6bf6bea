"""Procrastinate, a PostgreSQL task queue, as a delay queue: one job per order, scheduled at its deadline.

Its worker is woken by a NOTIFY when a job is deferred, but a job scheduled for later is not due
then: due scheduled jobs are found only by polling, every ``fetch_job_polling_interval`` seconds
(5 by default). Its tables, types and functions live in a PostgreSQL schema of their own in the
bench database, laid when a row is made (anew when the installed version differs from the one
that laid it), so emptying them never touches the orders.
"""

from __future__ import annotations

import functools
import importlib.metadata
import sys
from collections.abc import Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

from django.db import connection, transaction

from order_timeout.models import Order

from ..systems import CHUNK, FAKE_PK, System, _in_an_hour
from . import PEER_LIMITS

SCHEMA = "procrastinate"
TASK = "bench.close_order"
# Every job and what hangs off one; the workers' heartbeats only while no worker runs.
JOB_TABLES = ("procrastinate_jobs", "procrastinate_events", "procrastinate_periodic_defers")
WORKER_TABLE = "procrastinate_workers"


def _close_order(pk: int) -> None:
    """Close the order; when the job ran before the row's deadline, defer it again at that deadline."""
    from ..closers import close_one

    not_yet = close_one(pk)
    if not_yet is not None:
        app().tasks[TASK].configure(schedule_at=not_yet).defer(pk=pk)


async def _retry_stalled_jobs(timestamp: int) -> None:
    """Put the jobs of workers that stopped beating (killed mid-job) back to ``todo``."""
    manager = app().job_manager
    for job in await manager.get_stalled_jobs():
        await manager.retry_job(job)


@functools.cache
def app() -> Any:
    """The App with its tasks, made on first use: the package is imported only when the row runs."""
    import procrastinate

    made = procrastinate.App(connector=procrastinate.PsycopgConnector(conninfo=_conninfo()))
    made.task(name=TASK)(_close_order)
    # What its docs tell a production deployment to add for workers killed mid-job
    # (howto/production/retry_stalled_jobs): without it a stalled job stays "doing" forever.
    made.periodic(cron="*/10 * * * *")(
        made.task(name="bench.retry_stalled_jobs", queueing_lock="retry_stalled_jobs")(_retry_stalled_jobs))
    return made


def _conninfo() -> str:
    """Django's database, with procrastinate's schema first on the search path."""
    from psycopg.conninfo import make_conninfo

    db = connection.settings_dict
    given = {"dbname": db["NAME"], "user": db["USER"], "password": db["PASSWORD"], "host": db["HOST"],
             "port": str(db["PORT"] or "")}
    return make_conninfo(**{key: value for key, value in given.items() if value},
                         options=f"-c search_path={SCHEMA}")


@functools.cache
def _harness_app() -> Any:
    """The harness's side: the synchronous pool open and the schema laid (once per process)."""
    opened = app().open()
    sync = opened.connector.get_sync_connector()
    version = importlib.metadata.version("procrastinate")
    laid = sync.execute_query_one(
        query="SELECT (SELECT obj_description(oid, 'pg_namespace') FROM pg_namespace"
              " WHERE nspname = %(schema)s) AS version", schema=SCHEMA)
    if laid["version"] != version:
        sync.execute_query(query=f"DROP SCHEMA IF EXISTS {SCHEMA} CASCADE; CREATE SCHEMA {SCHEMA}")
        opened.schema_manager.apply_schema()
        sync.execute_query(query=f"COMMENT ON SCHEMA {SCHEMA} IS '{version}'")
    return opened


def _empty(tables: Sequence[str]) -> None:
    names = ", ".join(f"{SCHEMA}.{table}" for table in tables)
    _harness_app().connector.get_sync_connector().execute_query(query=f"TRUNCATE {names} CASCADE")


def _defer(pks: Sequence[int], deadlines: Sequence[datetime | None]) -> None:
    """One job per order, CHUNK to an INSERT.

    ``batch_defer`` gives every job of a call the one ``schedule_at``, and a steady stream has a
    deadline per order; the job manager's ``batch_defer_jobs`` (what ``batch_defer`` calls) takes
    jobs scheduled apart, each made from the task's own configured job.
    """
    harness = _harness_app()
    template = harness.tasks[TASK].configure().job
    for start in range(0, len(pks), CHUNK):
        harness.job_manager.batch_defer_jobs(jobs=[
            template.evolve(task_kwargs={"pk": pk}, scheduled_at=deadline)
            for pk, deadline in zip(pks[start:start + CHUNK], deadlines[start:start + CHUNK], strict=True)])


def work(polling_interval: float | None) -> None:
    """One worker process, one job at a time (its default; ``concurrency`` is for async tasks)."""
    options = {} if polling_interval is None else {"fetch_job_polling_interval": polling_interval}
    app().run_worker(**options)


class Procrastinate(System):
    """Procrastinate at its documented defaults: a worker polls for due scheduled jobs every 5 s.

    One job per order, deferred with ``schedule_at=deadline``; its task runs the shared close
    (``bench.closers.close_one``) and defers itself again at the row's deadline when it ran early.
    Two workers of one job at a time each: its docs advise against ``concurrency`` for
    synchronous tasks. The jobs stay in the table when done (``delete_jobs="never"``, the default).
    """

    name = "procrastinate"
    label = "Procrastinate: defer(schedule_at=deadline), worker polls every 5 s (its default)"
    closers = "2 workers, concurrency 1 (its default), 1 tx per order"
    polling_interval: float | None = None  # fetch_job_polling_interval; None: its default, 5 s
    memory = "table"
    full_only = True
    limits = PEER_LIMITS
    vendors = ("postgresql",)
    # One INSERT per 5,000 jobs, but procrastinate_defer_jobs_v1 inserts them one by one, each with its
    # event row and NOTIFY: 200 us a job on a quiet 2-vCPU VM.
    enqueue_seconds = 0.0003
    crash_note = (
        "A worker killed mid-job (SIGKILL, or a second SIGTERM) leaves that job 'doing', and nothing "
        "runs it again until a periodic task calls JobManager.get_stalled_jobs() and retry_job(): the "
        "docs' recipe, installed here, runs every 10 minutes and takes a job as stalled once its "
        "worker's heartbeat (every 10 s) is 30 s old, so that order closes up to about 10 minutes late "
        "(the close re-checks the row under its lock, so a job whose close had committed closes "
        "nothing twice); jobs not yet fetched go to the other worker. A task that raised leaves its "
        "job 'failed', never retried (no retry strategy by default). The broker is PostgreSQL itself: "
        "jobs are rows, so losing it loses no job, but the worker exits once its pool has found no "
        "connection for 30 s (procrastinate#1116) and can hang on a half-open one (#1334, #1513), so "
        "a supervisor must restart it; a defer in on_commit that fails after the order's commit "
        "leaves that order with no job, and nothing scans for one.")

    def __init__(self, record_dir: Path) -> None:
        super().__init__(record_dir)
        # Before the create measure, which runs before any row starts.
        _harness_app()

    def commands(self) -> list[list[str]]:
        # manage.py for Django's setup: the task closes through the ORM.
        call = f"from bench.peers.procrastinate import work; work({self.polling_interval!r})"
        return [[sys.executable, "manage.py", "shell", "-c", call] for _ in range(self.processes)]

    def start(self) -> None:
        _empty((*JOB_TABLES, WORKER_TABLE))
        super().start()

    def enqueue(self, orders: Sequence[Order]) -> None:
        _defer([order.pk for order in orders], [order.expires_at for order in orders])

    def enqueue_on_commit(self, order: Order) -> None:
        task = _harness_app().tasks[TASK]
        pk, deadline = order.pk, order.expires_at
        transaction.on_commit(lambda: task.configure(schedule_at=deadline).defer(pk=pk))

    def hold_far_future(self, count: int) -> None:
        _defer(range(FAKE_PK, FAKE_PK + count), [_in_an_hour()] * count)

    def forget_far_future(self) -> None:
        _empty(JOB_TABLES)  # the workers run: their heartbeats stay


class ProcrastinateTuned(Procrastinate):
    """Procrastinate with the knob that decides its latency tuned: its workers poll every 0.1 s."""

    name = "procrastinate_tuned"
    label = "Procrastinate: defer(schedule_at=deadline), worker polls every 0.1 s (tuned)"
    polling_interval = 0.1


SYSTEMS = (Procrastinate, ProcrastinateTuned)
