"""Celery 5.5+ on RabbitMQ with native delayed delivery: the seeds' third design (seed 002,
RabbitMQ TTL + dead-letter exchange) as a Django shop gets it off the shelf.

The broker is RabbitMQ on loopback, started by scripts/bench when this row runs (a vhost of the
bench's own, BENCH_AMQP_URL); the Celery app is ``bench/peers/celery_rabbitmq_app.py``.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from django.db import transaction

from ..systems import FAKE_PK, CeleryEta
from . import PEER_LIMITS


class CeleryRabbitmq(CeleryEta):
    """One ``apply_async(countdown=...)`` per order, delayed inside RabbitMQ, closed by ``close_one``.

    Documented settings (Celery's "Using RabbitMQ" page, native delayed delivery): the task queue
    a quorum queue (``task_default_queue_type="quorum"``; ``worker_detect_quorum_queues``, on by
    default, then turns native delayed delivery on), on a topic exchange, publisher confirms
    (``broker_transport_options={"confirm_publish": True}``); the 28 delay levels are quorum
    queues too. The countdown is whole seconds (the levels' granularity), rounded up: never
    early, up to a second late. ``task_acks_late`` and ``task_reject_on_worker_lost``, as
    Celery advises for an idempotent task: the close re-checks the row under its lock.

    Pending orders wait in the broker's queues, not in the worker: a crashed worker loses
    none of them, and what it had taken (running or prefetched, up to 8, unacked) the broker
    redelivers to the restarted worker at once. Quorum queues are durable and their messages
    on disk: a broker restart keeps every delayed message (those whose TTL ran out meanwhile
    are dead-lettered on, late by the outage); a broker whose disk is lost loses them all, and
    nothing in the shop finds those orders again. While the broker is down, ``apply_async``
    fails and the order never gets its timer unless the shop retries the publish.
    """

    name, label = ("celery_rabbitmq",
                   "Celery on RabbitMQ: apply_async(countdown) per order, native delayed delivery (quorum queues)")
    closers = "1 worker, prefork pool of 2, acks_late, 1 tx per order; delays in RabbitMQ (1 s steps)"
    loses_redis = False  # no Redis: its broker is RabbitMQ
    crash_note = ("Worker killed: its unacked tasks (acks_late: the ones running and prefetched, up to 8) go "
                  "back to the queue when its connection drops and the restarted worker runs them (the row "
                  "re-check stops a second close); the delayed ones wait in the broker, untouched. Broker lost: "
                  "quorum queues are durable, so a restart keeps the delayed messages (late by the outage); a "
                  "lost disk loses every pending order, and publishes fail while it is down.")
    full_only = True
    limits = PEER_LIMITS
    memory = "broker"
    # A confirmed publish to a quorum queue waits for its Raft log write: about 4.5 ms here.
    enqueue_seconds = 0.005

    def __init__(self, record_dir: Path) -> None:
        super().__init__(record_dir)
        from . import celery_rabbitmq_app

        self.celery = celery_rabbitmq_app
        # The worker's broker: CELERY_BROKER_URL (the Redis-brokered rows') would win over broker_url.
        self.extra_env = {"CELERY_BROKER_URL": celery_rabbitmq_app.AMQP_URL}

    def commands(self) -> list[list[str]]:
        return [[sys.executable, "-m", "celery", "-A", "bench.peers.celery_rabbitmq_app", "worker",
                 "--pool=prefork", "--concurrency=2", "-Q", self.celery.QUEUE, "--loglevel=WARNING",
                 "--without-gossip", "--without-mingle", "--without-heartbeat"]]

    def start(self) -> None:
        """A fresh row starts on empty queues; a restart (after a crash) keeps what waits there."""
        if not self.logs:
            self.celery.declare()
            self.celery.purge()
        super().start()

    def memory_pids(self) -> list[int]:
        """The broker's Erlang VM: pending orders wait in its queues."""
        return _broker_pids()

    def in_flight(self) -> int:
        """Tasks in the task queue: a killed worker's, given back, that the next one will run."""
        with self.celery.app.connection_for_write() as conn:
            return int(conn.default_channel.queue_declare(self.celery.QUEUE, passive=True).message_count)

    def enqueue(self, orders: Sequence[Any]) -> None:
        for order in orders:
            self.celery.publish(order.pk, order.expires_at)

    def enqueue_on_commit(self, order: Any) -> None:
        pk, deadline = order.pk, order.expires_at
        transaction.on_commit(lambda: self.celery.publish(pk, deadline))

    def forget_far_future(self) -> None:
        """The idle workload's tasks wait in the delay levels: purge them (the worker keeps running)."""
        self.celery.purge()

    def hold_far_future(self, count: int) -> None:
        deadline = _in_an_hour()
        for pk in range(FAKE_PK, FAKE_PK + count):
            self.celery.publish(pk, deadline)


def _in_an_hour() -> datetime:
    from django.utils import timezone

    return timezone.now() + timedelta(hours=1)


def _broker_pids() -> list[int]:
    """RabbitMQ's ``beam.smp`` on this machine (scripts/bench starts one)."""
    pids = []
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and (entry / "comm").read_text().strip() == "beam.smp" \
                    and b"rabbit" in (entry / "cmdline").read_bytes():
                pids.append(int(entry.name))
        except OSError:
            continue
    return pids


SYSTEMS = (CeleryRabbitmq,)
