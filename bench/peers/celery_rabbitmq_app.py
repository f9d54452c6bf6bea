"""Celery on RabbitMQ as a delay queue: one task per order, delayed by the broker (native delayed delivery).

Celery 5.5+ publishes a countdown on a quorum queue to a chain of 28 queues,
``celery_delayed_27`` .. ``celery_delayed_0``, each a topic exchange and a
queue whose message TTL is 2**level seconds; the countdown's bits, one word of
the routing key each, route the message through the levels whose bit is set,
and each level dead-letters it to the next when its TTL runs out (the seeds'
third design, seed 002: RabbitMQ TTL + dead-letter exchange). The worker sees
the task only when it is due: it holds nothing while it waits.
"""

from __future__ import annotations

import functools
import math
import os
from datetime import datetime

from celery import Celery
from celery.signals import worker_process_shutdown

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "testproject.settings")

QUEUE = "bench_rabbitmq"
# The bench's own vhost on the loopback broker scripts/bench starts (the guest user may log in
# from loopback only): purging it can touch nothing else.
AMQP_URL = os.environ.get("BENCH_AMQP_URL", "amqp://guest:guest@127.0.0.1:5672/order_timeout_bench")

# Not the current app where it is only imported (the harness finds the peers by importing their
# modules): the worker makes it current in its own processes.
app = Celery("bench_rabbitmq", set_as_current=False)
app.config_from_object("django.conf:settings", namespace="CELERY")
app.conf.update(
    # The read and write URLs too: CELERY_BROKER_URL in the environment (the harness's, for the
    # Redis-brokered rows) would win over broker_url alone.
    broker_url=AMQP_URL,
    broker_read_url=AMQP_URL,
    broker_write_url=AMQP_URL,
    # Native delayed delivery, as Celery's "Using RabbitMQ" page sets it up: the task queue a
    # quorum queue (which is what turns it on, worker_detect_quorum_queues being on by default)
    # bound to a topic exchange (a direct one makes Celery fall back to ETA timers in the worker),
    # and publisher confirms, which the docs advise with quorum queues.
    task_default_queue=QUEUE,
    task_default_exchange=QUEUE,
    task_default_exchange_type="topic",
    task_default_routing_key=QUEUE,
    task_default_queue_type="quorum",
    worker_detect_quorum_queues=True,
    broker_native_delayed_delivery_queue_type="quorum",
    broker_transport_options={"confirm_publish": True},
    # Acked once the close has run, and given back if its pool process dies: a worker killed
    # mid-task leaves the message to the broker, which redelivers it (the close re-checks the
    # row under its lock, so a second delivery closes nothing twice).
    task_acks_late=True,
    task_reject_on_worker_lost=True,
    # The Redis result backend the test project names is not wanted here.
    result_backend=None,
    task_ignore_result=True,
    broker_connection_retry_on_startup=True,
)


@worker_process_shutdown.connect
def write_commit_records(**kwargs: object) -> None:
    # Pool children leave without running atexit handlers.
    from bench.recorder import flush

    flush()


def countdown(deadline: datetime) -> int | None:
    """Whole seconds to ``deadline``, rounded up; None when it is due already.

    The delay levels count whole seconds and Celery floors a countdown to them (and refuses
    one under a second), so ``eta=deadline`` would fire up to a second early and cost a
    second message and a second transaction; rounding up fires up to a second late, once.
    """
    from django.utils import timezone

    seconds = (deadline - timezone.now()).total_seconds()
    return math.ceil(seconds) if seconds > 0 else None


def publish(pk: int, deadline: datetime) -> None:
    _declared_once()
    close_order.apply_async(args=[pk], countdown=countdown(deadline))


@functools.cache
def _declared_once() -> None:
    """The first publish of a process declares the delay levels: on a fresh broker nothing else
    has yet when the harness times the create transaction, before any worker started."""
    declare()


@app.task(name="bench.rabbitmq.close_order", ignore_result=True)
def close_order(pk: int) -> None:
    from bench.closers import close_one

    not_yet = close_one(pk)
    if not_yet is not None:
        # Due later than the broker delivered it (another clock, or a deadline moved): again then.
        publish(pk, not_yet)


def declare() -> None:
    """Declare the 28 delay levels and the task queue with its bindings, as a worker does on start.

    The publisher needs them too: a countdown goes to ``celery_delayed_27``, and before the
    first worker has run there is no such exchange.
    """
    from kombu.transport.native_delayed_delivery import (
        bind_queue_to_native_delayed_delivery_exchange,
        declare_native_delayed_delivery_exchanges_and_queues,
    )

    with app.connection_for_write() as conn:
        declare_native_delayed_delivery_exchanges_and_queues(conn, app.conf.broker_native_delayed_delivery_queue_type)
        for queue in app.amqp.queues.values():
            queue.bind(conn.default_channel).declare()
            bind_queue_to_native_delayed_delivery_exchange(conn, queue)


def purge() -> int:
    """Empty the delay levels and the task queue; how many messages they held."""
    from kombu.transport.native_delayed_delivery import MAX_NUMBER_OF_BITS_TO_USE, level_name

    with app.connection_for_write() as conn:
        channel = conn.default_channel
        return sum(channel.queue_purge(name) or 0
                   for name in [level_name(level) for level in range(MAX_NUMBER_OF_BITS_TO_USE)] + [QUEUE])
