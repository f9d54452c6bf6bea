"""The notices row's job done the common way (issue 26): Celery ``delay()`` from ``on_commit()``.

Our consumers close the burst as in the notices row (``ours_notices``); the
webhook per order goes the way shops send one today: an ``order_expired``
receiver publishes a Celery task from ``transaction.on_commit()``, and a
Celery worker (prefork, its default pool of one process per CPU: 2 here)
POSTs it to the same sink (bench/peers/celery_notices_app.py). So the two rows
differ only in how the notice travels: a row written in the close's
transaction and delivered by the consumers, or a message published after it
and run by a worker.
"""

from __future__ import annotations

import sys
import time
from typing import Any

from ..systems import Ours


class CeleryNotices(Ours):
    name, label = ("celery_notices",
                   "django-order-timeout closing, a webhook per order by Celery delay() from on_commit (Redis broker)")
    closers = "2 consumers, batch 500; 1 Celery worker, prefork pool of 2, acks on start"
    processes = 3
    consumers = 2
    startup_seconds = 4.0
    extra_env = {"BENCH_CELERY_NOTICES": "1", "BENCH_RECORD_AT_COMMIT": "1"}
    workloads = ("steady", "burst", "crash")
    measures_create = False
    full_only = True
    delivers_notices = True
    crash_victims = (("crash", 0, "a consumer"), ("crash_worker", 2, "the Celery worker"))
    crash_freezes = ()
    loses_redis = False
    crash_note = ("Closes as ours. A consumer killed after a batch's COMMIT and before its on_commit callbacks "
                  "published every task loses the rest of that batch's notices: nothing wrote them down, and "
                  "the takeover finds the orders closed (the row re-check), so it sends nothing. The worker "
                  "killed loses the tasks it was running (acked when they started); those it had prefetched "
                  "come back when the broker's visibility_timeout (an hour) runs out, late by that hour. A "
                  "broker down when the callback runs: delay() raises after the commit, the notice is lost.")

    def start(self) -> None:
        self.extra_env = {**type(self).extra_env, "BENCH_SINK_URL": self.sink.url}
        super().start()

    # The worker's pool: Celery's default (prefork, a process per CPU), or threads (the tuned row).
    pool = ("--pool=prefork", "--concurrency=2")

    def commands(self) -> list[list[str]]:
        from .celery_notices_app import QUEUE

        return [*super().commands(),
                [sys.executable, "-m", "celery", "-A", "bench.peers.celery_notices_app", "worker",
                 *self.pool, "-Q", QUEUE, "--loglevel=WARNING",
                 "--without-gossip", "--without-mingle", "--without-heartbeat"]]

    def _broker(self) -> Any:
        from redis import Redis

        from .celery_notices_app import app

        return Redis.from_url(app.conf.broker_url)

    def _waiting(self) -> int:
        from .celery_notices_app import QUEUE

        return int(self._broker().llen(QUEUE))

    def notices_pending(self) -> int:
        """Tasks in the queue, and those a worker holds (running, prefetched, or due later: a retry)."""
        client = self._broker()
        return self._waiting() + int(client.hlen("unacked"))

    def in_flight(self) -> int:
        """Members leased, tasks in the queue, and, while the sink still hears from the worker, the
        tasks it holds. A killed worker's prefetched tasks stay held for the broker's visibility
        timeout (an hour): past the wait, so not waited for."""
        from ..notices import QUIET

        last = self.sink.last_arrival()
        held = int(self._broker().hlen("unacked")) if last is not None and time.time() - last < QUIET else 0
        return super().in_flight() + self._waiting() + held

    def busy(self, victim: int = 0) -> bool:
        """The worker: once tasks wait for it (it holds some running and prefetched); a consumer:
        as ours."""
        return self._waiting() > 0 if victim == 2 else super().busy(victim)


class CeleryNoticesThreads(CeleryNotices):
    """The same, its worker tuned for a job that waits on the network: a pool of 32 threads, as
    many as a consumer of ours delivers notices on."""

    name, label = ("celery_notices_threads",
                   "django-order-timeout closing, a webhook per order by Celery delay() from on_commit, "
                   "worker on 32 threads (tuned)")
    closers = "2 consumers, batch 500; 1 Celery worker, a pool of 32 threads, acks on start"
    pool = ("--pool=threads", "--concurrency=32")


SYSTEMS = (CeleryNotices, CeleryNoticesThreads)
